"""Handing memory freed after a burst of short-lived allocations back to the system.

A build or sweep of a large seed index allocates and frees many times what the index keeps.
The C allocator keeps the freed pages inside its heaps, between blocks still in use, so the
process's resident size stays at the burst's peak. glibc's `malloc_trim` releases the free
pages of every heap; other C libraries have no such call, and their processes keep the pages.
"""

from __future__ import annotations


def release_freed_memory() -> bool:
    """Ask the C allocator to return its heaps' free pages to the system; False where it cannot."""
    import ctypes  # here: only a process that ends such a burst loads it

    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    trim(0)
    return True
