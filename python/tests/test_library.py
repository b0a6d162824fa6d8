"""Finding libstensor.so: STENSOR_LIBRARY, the preloaded copy, a path."""

import os
import tempfile
import unittest
from unittest import mock

from stensor import _library
from stensor._library import LibraryError, find_library, preloaded_library


class LibraryTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        self.lib = self._file("lib/libstensor.so")
        self.other = self._file("other/libstensor.so")
        self.no_maps = self._file("maps-none", "00400000-00401000 r-xp 00000000 08:01 1 /usr/bin/python3\n")

    def _file(self, name, text=""):
        path = os.path.join(self.dir.name, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        return path

    def _maps(self, path):
        return self._file("maps", "7f0000000000-7f0000001000 r-xp 00000000 08:01 42 %s\n"
                          "7f0000002000-7f0000003000 rw-p 00000000 00:00 0 \n" % path)

    def test_environment_wins(self):
        env = {"STENSOR_LIBRARY": self.other, "LD_PRELOAD": self.lib}
        self.assertEqual(find_library(self.lib, env, self._maps(self.lib)), self.other)

    def test_environment_naming_nothing_is_an_error(self):
        with self.assertRaisesRegex(LibraryError, "STENSOR_LIBRARY=.*no such file"):
            find_library(None, {"STENSOR_LIBRARY": self.lib + ".missing"}, self.no_maps)

    def test_mapped_copy(self):
        self.assertEqual(find_library(None, {}, self._maps(self.lib)), self.lib)
        self.assertEqual(preloaded_library(self._maps(self.lib), ""), self.lib)

    def test_ld_preload_when_maps_unreadable(self):
        for value in (self.lib, "/x/libother.so:" + self.lib, "/x/libother.so " + self.lib):
            env = {"LD_PRELOAD": value}
            self.assertEqual(find_library(None, env, self.no_maps + ".missing"), self.lib, value)

    def test_ld_preload_of_a_missing_file_is_skipped(self):
        env = {"LD_PRELOAD": self.lib + ".gone/libstensor.so"}
        with self.assertRaisesRegex(LibraryError, "not found"):
            find_library(None, env, self.no_maps)

    def test_other_libraries_are_not_stensor(self):
        maps = self._file("maps2", "7f0-7f1 r-xp 00000000 08:01 42 /x/libstensor.so.bak\n")
        self.assertIsNone(preloaded_library(maps, "/x/libstensor_old.so"))

    def test_explicit_path_last(self):
        self.assertEqual(find_library(self.other, {}, self.no_maps), self.other)
        with self.assertRaisesRegex(LibraryError, "no such file"):
            find_library(self.other + ".missing", {}, self.no_maps)

    def test_nothing_found_says_what_to_do(self):
        with self.assertRaisesRegex(LibraryError, "STENSOR_LIBRARY.*LD_PRELOAD.*path"):
            find_library(None, {}, self.no_maps)

    def test_load_of_a_file_that_is_no_library(self):
        with mock.patch.dict(os.environ, {"STENSOR_LIBRARY": self.lib}):  # an empty file
            with self.assertRaisesRegex(LibraryError, "cannot load"):
                _library.load_library()

    def test_same_file(self):
        link = os.path.join(self.dir.name, "link.so")
        os.symlink(self.lib, link)
        self.assertTrue(_library.same_file(link, self.lib))
        self.assertFalse(_library.same_file(self.other, self.lib))
        self.assertFalse(_library.same_file(self.lib + ".missing", self.lib))


if __name__ == "__main__":
    unittest.main()
