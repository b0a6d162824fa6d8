"""stensor from Python: the preloaded libstensor.so's statistics, and
PyTorch's allocator on it (stensor.torch.use_allocator)."""

from stensor._library import LibraryError, find_library, load_library, preloaded_library
from stensor._stats import stats

__all__ = ["LibraryError", "find_library", "load_library", "preloaded_library", "stats"]
