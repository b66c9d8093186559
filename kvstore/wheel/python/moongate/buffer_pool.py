"""Mooncake's local-buffer pools (``mooncake.store.BufferPool``, ``RegisteredBufferPool``):
buffers already registered with a store, handed out as leases for the zero-copy calls
(``put_from``, ``get_into`` and their batch forms) and taken back for the next caller.

A pool hands out buffers by size class (powers of two from ``min_size_class`` up to
``max_size_class``; a larger request gets a buffer of its own size), up to ``max_bytes`` in
all (0: twice the store's ``local_buffer_size``, and never less than it) and ``max_regions``
buffers. A buffer is shared memory from ``MooncakeHostMemAllocator``, registered with the
store once, kept while the pool lives; when the pool is full, idle buffers of other sizes
are given back to make room. An exhausted pool blocks the caller (``block_on_exhaustion``,
``default_timeout``; per call ``block`` and ``timeout``) until a lease comes back.

A lease (``BufferLease``) has ``ptr``, ``size`` (what was asked), ``buffer`` (a writable
``memoryview``), ``release()``, and is a context manager. It cannot be released while a
``memoryview`` from its ``buffer`` is alive (``RuntimeError``, as Mooncake's); releasing
twice is a no-op, and a lease dropped unreleased goes back when the last view of it goes.
Errors are Mooncake's ``RuntimeError`` messages. ``prewarm(size, count)`` fills the pool
ahead (Mooncake's does nothing).
"""

import ctypes
import threading
import time
import weakref

from moongate._native import MooncakeHostMemAllocator

__all__ = ["BufferPool", "BufferLease", "BufferLeaseView", "RegisteredBufferPool",
           "RegisteredBufferLease", "RegisteredBufferLeaseView"]


class BufferLeaseView:
    """One exported view of a lease: ``buffer`` is its ``memoryview``; the lease cannot be
    released while it lives."""

    def __init__(self, lease, size):
        array = (ctypes.c_ubyte * size).from_address(lease.ptr)
        lease._exports += 1
        # The view's bytes are the array's; when the last memoryview of them goes, the
        # array goes and the lease counts one export less (the closure keeps the lease).
        weakref.finalize(array, lease._drop_export)
        self._buffer = memoryview(array).cast("B")

    @property
    def buffer(self):
        return self._buffer


class BufferLease:
    """A buffer of a ``BufferPool``, held until ``release()`` (or the end of a ``with``)."""

    def __init__(self, pool, region, size):
        self._pool, self._region, self._size = pool, region, size
        self._exports = 0
        self._closed = False

    @property
    def ptr(self) -> int:
        if self._closed:
            raise RuntimeError("buffer lease is closed")
        return self._region[0]

    @property
    def size(self) -> int:
        return self._size

    @property
    def buffer(self):
        """A writable ``memoryview`` of the lease's ``size`` bytes."""
        if self._closed:
            raise RuntimeError("buffer lease is closed")
        return BufferLeaseView(self, self._size).buffer

    def _drop_export(self):
        self._exports -= 1

    def release(self):
        """Gives the buffer back; refused while a view of it is alive."""
        if self._closed:
            return
        if self._exports:
            raise RuntimeError("cannot release buffer while exported views exist")
        self._closed = True
        self._pool._give_back(self._region)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
        return False

    def __del__(self):
        if not self._closed and not self._exports:
            try:
                self.release()
            except Exception:  # the pool may be closing with the interpreter
                pass


class BufferPool:
    """Registered buffers of ``store`` for the zero-copy calls (see the module doc)."""

    def __init__(self, store, max_bytes=0, min_size_class=65536, max_size_class=None,
                 alignment=8 << 20, block_on_exhaustion=True, default_timeout=None,
                 max_regions=None, prewarm_size=None, prewarm_count=0):
        local = store.local_buffer_size() if store is not None else None
        if local is None:
            raise RuntimeError("MooncakeDistributedStore is not initialized")
        if min_size_class <= 0 or alignment <= 0:
            raise RuntimeError("min_size_class and alignment must be positive")
        if alignment < ctypes.sizeof(ctypes.c_void_p) or alignment & (alignment - 1):
            raise RuntimeError("alignment must be a power of two and at least sizeof(void*)")
        if local == 0:
            raise RuntimeError("BufferPool requires a store configured with a local buffer")
        self._store = store
        self._max_bytes = 2 * local if max_bytes == 0 else max(max_bytes, local)
        self._min_class = min_size_class
        self._max_class = self._max_bytes if max_size_class is None else max_size_class
        self._block = block_on_exhaustion
        self._timeout = default_timeout
        self._max_regions = max_regions
        self._alloc = MooncakeHostMemAllocator()
        self._cond = threading.Condition()
        self._idle = {}  # size -> [(ptr, size)]
        self._in_use = set()  # ptrs
        self._regions = 0
        self._bytes = 0
        self._closed = False
        if prewarm_size is not None and prewarm_count > 0:
            self.prewarm(prewarm_size, prewarm_count)

    def _class_of(self, size: int) -> int:
        if size > self._max_class:
            return max(size, 1)
        c = self._min_class
        while c < size:
            c <<= 1
        return c

    def _new_region_locked(self, size):
        """A fresh registered buffer of ``size`` bytes, making room by giving idle buffers
        back; None when the pool is full of buffers in use."""
        while (self._bytes + size > self._max_bytes
               or (self._max_regions is not None and self._regions >= self._max_regions)):
            idle = next((s for s, rs in self._idle.items() if rs), None)
            if idle is None:
                return None
            self._drop_region_locked(self._idle[idle].pop())
        ptr = self._alloc.alloc(size)
        if ptr == 0:
            raise RuntimeError("buffer allocation failed")
        if self._store.register_buffer(ptr, size) != 0:
            self._alloc.free(ptr)
            raise RuntimeError("overflow buffer registration failed")
        self._regions += 1
        self._bytes += size
        return (ptr, size)

    def _drop_region_locked(self, region):
        ptr, size = region
        self._store.unregister_buffer(ptr)
        self._alloc.free(ptr)
        self._regions -= 1
        self._bytes -= size

    def acquire(self, size, block=None, timeout=None):
        """A lease of a buffer of at least ``size`` bytes."""
        block = self._block if block is None else bool(block)
        timeout = self._timeout if timeout is None else timeout
        if timeout is not None and timeout < 0:
            raise RuntimeError("timeout must be non-negative")
        c = self._class_of(size)
        if c > self._max_bytes:
            raise RuntimeError("requested buffer size exceeds pool capacity")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("buffer pool is closed")
                idle = self._idle.get(c)
                region = idle.pop() if idle else self._new_region_locked(c)
                if region is not None:
                    self._in_use.add(region[0])
                    return BufferLease(self, region, size)
                if not block:
                    raise RuntimeError("buffer pool is exhausted")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise RuntimeError("timed out waiting for buffer")
                self._cond.wait(left)

    def buffer(self, size, block=None, timeout=None):
        """A writable ``memoryview`` of a new lease of ``size`` bytes; the buffer goes back
        to the pool once the view (and every view made from it) is gone."""
        lease = self.acquire(size, block, timeout)
        return BufferLeaseView(lease, size).buffer

    def prewarm(self, size, count):
        """Registers ``count`` idle buffers for requests of ``size`` bytes ahead of time (as
        many as fit)."""
        c = self._class_of(size)
        with self._cond:
            for _ in range(count):
                if self._closed:
                    raise RuntimeError("buffer pool is closed")
                if (self._bytes + c > self._max_bytes
                        or (self._max_regions is not None and self._regions >= self._max_regions)):
                    break
                region = self._new_region_locked(c)
                self._idle.setdefault(c, []).append(region)

    def _give_back(self, region):
        with self._cond:
            self._in_use.discard(region[0])
            if self._closed:
                self._drop_region_locked(region)
            else:
                self._idle.setdefault(region[1], []).append(region)
            self._cond.notify_all()

    def close(self):
        """Unregisters and frees every buffer; refused while leases are out."""
        with self._cond:
            if self._closed:
                return
            if self._in_use:
                raise RuntimeError("cannot close buffer pool with active leases")
            for regions in self._idle.values():
                for r in regions:
                    self._drop_region_locked(r)
            self._idle.clear()
            self._closed = True
            self._cond.notify_all()


RegisteredBufferPool = BufferPool
RegisteredBufferLease = BufferLease
RegisteredBufferLeaseView = BufferLeaseView
