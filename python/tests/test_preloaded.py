"""The package in a process that preloads libstensor.so, on the fake CUDA
driver: stats() before and after allocations under a cap and without one,
and use_allocator() finding the mapped copy. Needs TEST_LIBSTENSOR
(libstensor.so) and TEST_FAKECUDA (the fake libcuda.so.1), as
tests/python_test.sh sets them; skipped without."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBRARY = os.environ.get("TEST_LIBSTENSOR")
FAKECUDA = os.environ.get("TEST_FAKECUDA")

# Allocates and writes COUNT buffers of SIZE bytes on device 0 through the
# driver, as a framework would (ctypes resolves each entry point with dlsym:
# stensor's hooks), printing stats() before and after.
PROGRAM = r"""
import ctypes, json, sys
sys.path.insert(0, sys.argv[1])
import stensor
count, size = int(sys.argv[2]), int(sys.argv[3])
before = stensor.stats()
cuda = ctypes.CDLL("libcuda.so.1")
def check(r, what):
    if r != 0:
        raise SystemExit("%s failed: %d" % (what, r))
check(cuda.cuInit(0), "cuInit")
ctx = ctypes.c_void_p()
check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "cuDevicePrimaryCtxRetain")
check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
cuda.cuMemsetD8_v2.argtypes = [ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t]
for i in range(count):
    p = ctypes.c_uint64()
    check(cuda.cuMemAlloc_v2(ctypes.byref(p), size), "cuMemAlloc")
    check(cuda.cuMemsetD8_v2(p.value, i + 1, size), "cuMemsetD8")
check(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
print(json.dumps({"before": before, "after": stensor.stats()}))
"""

# use_allocator() on a stand-in for PyTorch, the library found as the
# environment says; prints the path it gave CUDAPluggableAllocator, or the
# error.
ALLOCATOR = r"""
import sys, types
sys.path.insert(0, sys.argv[1])
torch = types.ModuleType("torch")
got = []
torch.cuda = types.SimpleNamespace(is_initialized=lambda: False, memory=types.SimpleNamespace(
    CUDAPluggableAllocator=lambda path, m, f: got.append(path) or path,
    change_current_allocator=lambda a: None))
sys.modules["torch"] = torch
import stensor.torch
try:
    stensor.torch.use_allocator()
    print("allocator", got[0])
except Exception as e:
    print("error", type(e).__name__, e)
"""


@unittest.skipUnless(LIBRARY and FAKECUDA, "TEST_LIBSTENSOR and TEST_FAKECUDA not set")
class PreloadedTest(unittest.TestCase):
    def run_python(self, code, *args, preload=True, **env):
        e = dict(os.environ)
        for name in list(e):
            if name.startswith("STENSOR_"):
                del e[name]
        e["LD_LIBRARY_PATH"] = os.path.dirname(os.path.abspath(FAKECUDA))
        e["FAKECUDA_DEVICE_MEMORY"] = "1GiB"
        if preload:
            e["LD_PRELOAD"] = os.path.abspath(LIBRARY)
        else:
            e.pop("LD_PRELOAD", None)
        e.update(env)
        r = subprocess.run([sys.executable, "-c", code, PACKAGE] + [str(a) for a in args],
                           env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout.strip().splitlines()[-1]

    def test_stats_under_a_cap(self):
        out = json.loads(self.run_python(PROGRAM, 6, 32 << 20, STENSOR_MEMORY_LIMIT="64MiB",
                                         STENSOR_POLICY="lru", STENSOR_PREFETCH="off"))
        self.assertEqual(out["before"], {"started": False, "capped": False})
        after = out["after"]
        self.assertTrue(after["started"])
        self.assertTrue(after["capped"])
        self.assertEqual(after["policy"], "lru")
        self.assertGreater(after["peak_resident_bytes"], 0)
        self.assertLessEqual(after["peak_resident_bytes"], 64 << 20)
        # Six written buffers of 32 MiB under 64 MiB: at least four went out
        # by copy.
        self.assertGreaterEqual(after["swap_outs_copied"], 4)
        self.assertGreaterEqual(after["bytes_copied_out"], 4 * (32 << 20))
        self.assertEqual(after["driver_errors"], 0)

    def test_stats_without_a_cap(self):
        out = json.loads(self.run_python(PROGRAM, 2, 1 << 20))
        self.assertEqual(out["before"], {"started": False, "capped": False})
        self.assertEqual(out["after"], {"started": True, "capped": False})

    def test_stats_with_the_library_named(self):
        out = json.loads(self.run_python(PROGRAM, 1, 1 << 20,
                                         STENSOR_LIBRARY=os.path.abspath(LIBRARY)))
        self.assertEqual(out["after"], {"started": True, "capped": False})

    def test_use_allocator_finds_the_mapped_copy(self):
        line = self.run_python(ALLOCATOR)
        self.assertTrue(line.startswith("allocator "), line)
        self.assertTrue(os.path.samefile(line.split(" ", 1)[1], LIBRARY), line)

    def test_use_allocator_refuses_another_copy(self):
        with tempfile.TemporaryDirectory() as d:
            copy = os.path.join(d, "libstensor.so")
            shutil.copy(LIBRARY, copy)
            line = self.run_python(ALLOCATOR, STENSOR_LIBRARY=copy)
        self.assertRegex(line, "^error LibraryError .* is not the preloaded libstensor.so")

    def test_use_allocator_without_preload(self):
        line = self.run_python(ALLOCATOR, preload=False,
                               STENSOR_LIBRARY=os.path.abspath(LIBRARY))
        self.assertRegex(line, "^error LibraryError libstensor.so is not preloaded")


if __name__ == "__main__":
    unittest.main()
