"""Finding libstensor.so: STENSOR_LIBRARY, else the copy this process has
preloaded, else a path the caller gives."""

import ctypes
import os

ENV = "STENSOR_LIBRARY"
_NAME = "libstensor.so"


class LibraryError(RuntimeError):
    """libstensor.so could not be found, loaded, or is not the one preloaded."""


def _is_stensor(path):
    return os.path.basename(path) == _NAME


def preloaded_library(maps="/proc/self/maps", ld_preload=None):
    """The path of the libstensor.so mapped into this process (the preloaded
    copy), from `maps`; else the LD_PRELOAD entry naming one that exists;
    None when there is neither."""
    try:
        with open(maps) as f:
            for line in f:
                fields = line.split(None, 5)
                if len(fields) == 6 and _is_stensor(fields[5].strip()):
                    return fields[5].strip()
    except OSError:
        pass
    if ld_preload is None:
        ld_preload = os.environ.get("LD_PRELOAD", "")
    # The loader splits LD_PRELOAD at colons and blanks.
    for entry in ld_preload.replace(":", " ").split():
        if _is_stensor(entry) and os.path.exists(entry):
            return entry
    return None


def find_library(path=None, environ=None, maps="/proc/self/maps"):
    """The libstensor.so to use: $STENSOR_LIBRARY, else the preloaded one,
    else `path`. Raises LibraryError naming what was tried."""
    environ = os.environ if environ is None else environ
    named = environ.get(ENV)
    if named:
        if not os.path.isfile(named):
            raise LibraryError("%s=%r: no such file" % (ENV, named))
        return named
    loaded = preloaded_library(maps, environ.get("LD_PRELOAD", ""))
    if loaded is not None:
        return loaded
    if path is not None:
        if not os.path.isfile(path):
            raise LibraryError("%r: no such file" % (path,))
        return path
    raise LibraryError(
        "libstensor.so not found: set %s, preload it (LD_PRELOAD or `stensor run`), "
        "or pass its path" % ENV)


def load_library(path=None):
    """ctypes handle of find_library(path). For the preloaded copy this is
    that copy (dlopen finds the loaded object), whose hooks are active."""
    found = find_library(path)
    try:
        return ctypes.CDLL(found)
    except OSError as e:
        raise LibraryError("cannot load %s: %s" % (found, e)) from e


def same_file(a, b):
    """Whether paths `a` and `b` are one file (symbolic links followed)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
