"""PyTorch on stensor: every tensor's memory from stensor_torch_malloc and
back through stensor_torch_free (torch.cuda.memory.CUDAPluggableAllocator),
so that under a cap each tensor is a buffer stensor can swap."""

import os

from stensor._library import LibraryError, find_library, preloaded_library, same_file


def use_allocator(path=None):
    """Makes the preloaded libstensor.so PyTorch's CUDA allocator and
    returns the allocator. Must run before the first CUDA tensor (PyTorch
    cannot change allocators after), and the library must be the preloaded
    one (a copy loaded only by dlopen has no hooks active: its allocations
    would go round stensor)."""
    import torch  # here: `import stensor` must not need PyTorch

    if torch.cuda.is_initialized():
        raise RuntimeError(
            "stensor.torch.use_allocator() must run before the first CUDA tensor: "
            "CUDA is already initialised in this process")
    library = find_library(path)
    loaded = preloaded_library()
    if loaded is None:
        raise LibraryError(
            "libstensor.so is not preloaded, so its hooks are not active: start the "
            "program with LD_PRELOAD=%s (or under `stensor run`)" % os.path.abspath(library))
    if not same_file(library, loaded):
        raise LibraryError(
            "%s is not the preloaded libstensor.so (%s): its allocator would bypass the "
            "active hooks" % (library, loaded))
    alloc = torch.cuda.memory.CUDAPluggableAllocator(
        loaded, "stensor_torch_malloc", "stensor_torch_free")
    torch.cuda.memory.change_current_allocator(alloc)
    return alloc
