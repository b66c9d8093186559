"""Mooncake's local-buffer pools as their users use them: leases of registered buffers for
the zero-copy calls, reused by size class, blocking when the pool is exhausted, never
released under a live view, and closed only with every lease back."""

import threading

import pytest

from conftest import MiB


def test_leases_serve_the_zero_copy_calls_and_come_back(store):
    from mooncake.buffer_pool import BufferPool, RegisteredBufferPool

    assert RegisteredBufferPool is BufferPool
    pool = BufferPool(store, max_bytes=4 * MiB, min_size_class=64 * 1024)
    with pool.acquire(100_000) as lease:
        assert lease.size == 100_000
        first = lease.ptr
        view = lease.buffer
        view[:5] = b"hello"
        assert view.nbytes == 100_000
        del view
        assert store.put_from("bp-k", lease.ptr, 5) == 0
    # The same size class comes back: the same registered buffer, read into zero-copy.
    lease = pool.acquire(70_000)
    assert lease.ptr == first
    assert store.get_into("bp-k", lease.ptr, 70_000) == 5
    assert bytes(lease.buffer[:5]) == b"hello"
    lease.release()
    lease.release()  # a no-op, as Mooncake's
    with pytest.raises(RuntimeError, match="closed"):
        lease.ptr
    pool.close()


def test_a_live_view_holds_its_lease(store):
    from mooncake.store import BufferPool

    pool = BufferPool(store, max_bytes=1 * MiB)
    lease = pool.acquire(4096)
    view = lease.buffer
    with pytest.raises(RuntimeError, match="exported views exist"):
        lease.release()
    with pytest.raises(RuntimeError, match="active leases"):
        pool.close()
    view.release()
    lease.release()
    # A buffer handed out as a bare view goes back when the view goes.
    mv = pool.buffer(4096)
    mv[0] = 7
    with pytest.raises(RuntimeError, match="active leases"):
        pool.close()
    del mv
    pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.acquire(1)


def test_an_exhausted_pool_blocks_refuses_or_times_out(store):
    from mooncake.store import BufferPool

    local = store.local_buffer_size()
    pool = BufferPool(store, max_bytes=local, min_size_class=local)
    held = pool.acquire(local)
    with pytest.raises(RuntimeError, match="exhausted"):
        pool.acquire(1, block=False)
    with pytest.raises(RuntimeError, match="timed out"):
        pool.acquire(1, timeout=0.05)
    with pytest.raises(RuntimeError, match="exceeds pool capacity"):
        pool.acquire(local + 1)
    got = []
    waiter = threading.Thread(target=lambda: got.append(pool.acquire(1, timeout=10)))
    waiter.start()
    held.release()
    waiter.join(10)
    assert got and got[0].ptr == held._region[0]
    got[0].release()
    pool.close()


def test_what_a_pool_refuses_at_creation(master):
    from mooncake.store import BufferPool, MooncakeDistributedStore

    from conftest import new_store

    with pytest.raises(RuntimeError, match="not initialized"):
        BufferPool(MooncakeDistributedStore())
    s = new_store(master)
    try:
        with pytest.raises(RuntimeError, match="power of two"):
            BufferPool(s, alignment=3)
        with pytest.raises(RuntimeError, match="positive"):
            BufferPool(s, min_size_class=0)
        pool = BufferPool(s, max_bytes=1, prewarm_size=4096, prewarm_count=2)
        assert pool._max_bytes == s.local_buffer_size()  # never below the local buffer
        assert len(pool._idle[65536]) == 2
        pool.close()
    finally:
        assert s.close() == 0
