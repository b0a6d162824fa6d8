"""stensor.stats(): the counters STENSOR_STATS=1 prints at exit, while the
program runs."""

import ctypes
import json

from stensor._library import load_library


def stats(path=None):
    """The library's counters as a dict (stensor_stats_json): always
    "started" (a CUDA call has reached stensor) and "capped" (a memory
    limit is set); under a cap the swap counters too (peak_resident_bytes,
    swap_outs_copied, clean_drops, swap_ins, bytes_copied_in, ...; bytes as
    bytes, times in seconds). Asking starts nothing."""
    fn = load_library(path).stensor_stats_json
    fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    fn.restype = ctypes.c_size_t
    size = 4096
    while True:
        buf = ctypes.create_string_buffer(size)
        needed = fn(buf, size)
        if needed < size:
            return json.loads(buf.value.decode("utf-8"))
        size = needed + 1
