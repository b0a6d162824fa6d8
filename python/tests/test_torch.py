"""stensor.torch.use_allocator's checks, on a stand-in for PyTorch (the
calls it makes are recorded)."""

import os
import sys
import tempfile
import types
import unittest
from unittest import mock

import stensor.torch as stensor_torch
from stensor import LibraryError


def fake_torch(initialized=False):
    calls = []
    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace()
    torch.cuda.is_initialized = lambda: initialized

    class CUDAPluggableAllocator:
        def __init__(self, path, malloc, free):
            self.args = (path, malloc, free)
            calls.append(("CUDAPluggableAllocator", path, malloc, free))

    torch.cuda.memory = types.SimpleNamespace(
        CUDAPluggableAllocator=CUDAPluggableAllocator,
        change_current_allocator=lambda a: calls.append(("change_current_allocator", a)))
    return torch, calls


class UseAllocatorTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        self.lib = os.path.join(self.dir.name, "libstensor.so")
        open(self.lib, "w").close()
        env = mock.patch.dict(os.environ, {"STENSOR_LIBRARY": self.lib})
        env.start()
        self.addCleanup(env.stop)

    def use(self, torch, preloaded):
        with mock.patch.dict(sys.modules, {"torch": torch}), \
                mock.patch.object(stensor_torch, "preloaded_library", return_value=preloaded):
            return stensor_torch.use_allocator()

    def test_installs_the_preloaded_library(self):
        torch, calls = fake_torch()
        alloc = self.use(torch, self.lib)
        self.assertEqual(calls, [
            ("CUDAPluggableAllocator", self.lib, "stensor_torch_malloc", "stensor_torch_free"),
            ("change_current_allocator", alloc)])

    def test_same_file_by_another_path(self):
        link = os.path.join(self.dir.name, "link.so")
        os.symlink(self.lib, link)
        torch, calls = fake_torch()
        self.use(torch, link)
        self.assertEqual(calls[0][1], link)  # the mapped copy's own path

    def test_after_cuda_started(self):
        torch, calls = fake_torch(initialized=True)
        with self.assertRaisesRegex(RuntimeError, "before the first CUDA tensor"):
            self.use(torch, self.lib)
        self.assertEqual(calls, [])

    def test_not_preloaded(self):
        torch, calls = fake_torch()
        with self.assertRaisesRegex(LibraryError, "not preloaded.*LD_PRELOAD="):
            self.use(torch, None)
        self.assertEqual(calls, [])

    def test_another_copy_preloaded(self):
        other = os.path.join(self.dir.name, "other", "libstensor.so")
        os.makedirs(os.path.dirname(other))
        open(other, "w").close()
        torch, calls = fake_torch()
        with self.assertRaisesRegex(LibraryError, "is not the preloaded"):
            self.use(torch, other)
        self.assertEqual(calls, [])

    def test_without_pytorch(self):
        with mock.patch.dict(sys.modules, {"torch": None}):
            with self.assertRaises(ImportError):
                stensor_torch.use_allocator()


if __name__ == "__main__":
    unittest.main()
