"""`mooncake.engine.TransferEngine`: every method, Mooncake's return conventions, raw
addresses (numpy arrays) on both sides, threads sharing one engine, and bad input."""

import mmap
import threading

import numpy as np
import pytest

from conftest import MiB, wait_until
from mooncake.engine import (
    InnerTransferEngine,
    Read,
    TransferEngine,
    TransferNotify,
    TransferOpcode,
    Write,
)


def addr(a: np.ndarray) -> int:
    return a.ctypes.data


def pattern(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def test_names_and_opcodes():
    import mooncake.engine as me
    import moongate.engine as ge

    assert me.TransferEngine is ge.TransferEngine
    assert int(Read) == 0 and int(Write) == 1
    assert TransferEngine.TransferOpcode.Write == TransferOpcode.Write
    n = TransferNotify("a", "b")
    n.msg = "c"
    assert (n.name, n.msg) == ("a", "c")
    assert (TransferNotify().name, TransferNotify().msg) == ("", "")


def test_sync_batch_and_async_transfers_between_raw_buffers(engine_pair):
    a, b, target = engine_pair
    src, dst = pattern(4 * MiB, 1), np.zeros(4 * MiB, dtype=np.uint8)
    assert a.register_memory(addr(src), src.nbytes) == 0
    assert b.batch_register_memory([addr(dst)], [dst.nbytes]) == 0

    assert a.transfer_sync_write(target, addr(src), addr(dst), 1 * MiB) == 0
    assert (dst[: 1 * MiB] == src[: 1 * MiB]).all()

    # SGLang's PD addressing: base + page_index * item_len, pages scattered.
    item = 4096
    pages_src, pages_dst = [3, 9, 10, 200], [700, 1, 2, 55]
    rc = a.batch_transfer_sync_write(
        target,
        [addr(src) + p * item for p in pages_src],
        [addr(dst) + p * item for p in pages_dst],
        [item] * 4,
    )
    assert rc == 0
    for ps, pd in zip(pages_src, pages_dst):
        assert (dst[pd * item:(pd + 1) * item] == src[ps * item:(ps + 1) * item]).all()

    back = np.zeros(item, dtype=np.uint8)
    assert a.register_memory(addr(back), back.nbytes) == 0
    assert a.transfer_sync_read(target, addr(back), addr(dst) + 55 * item, item) == 0
    assert (back == src[200 * item:201 * item]).all()
    back[:] = 0
    assert a.batch_transfer_sync_read(target, [addr(back)], [addr(dst) + item], [item]) == 0
    assert (back == src[9 * item:10 * item]).all()

    bid = a.batch_transfer_async_write(target, [addr(src)], [addr(dst) + 2 * MiB], [MiB])
    assert bid != 0
    bid2 = a.batch_transfer_async_read(target, [addr(back)], [addr(dst)], [item])
    assert bid2 not in (0, bid)
    assert a.get_batch_transfer_status([bid, bid2]) == 0
    assert (dst[2 * MiB:3 * MiB] == src[:MiB]).all()
    assert (back == src[:item]).all()
    # A batch's status is read once.
    assert a.get_batch_transfer_status([bid]) == -1

    bid = a.batch_transfer_async(target, [addr(src) + MiB], [addr(dst) + 3 * MiB], [MiB], TransferOpcode.Write)
    assert a.get_batch_transfer_status([bid]) == 0
    assert (dst[3 * MiB:] == src[MiB:2 * MiB]).all()

    bid = a.transfer_submit_write(target, addr(src), addr(dst), 64)
    assert bid != 0
    assert wait_until(lambda: a.transfer_check_status(bid) != 0) == 1
    assert a.transfer_check_status(bid) == -1  # released once done

    assert a.transfer_sync(target, addr(src), addr(dst), 16, TransferOpcode.Read) == 0
    assert a.batch_transfer_sync(target, [addr(src)], [addr(dst)], [16], TransferOpcode.Write) == 0
    assert a.batch_unregister_memory([addr(src), addr(back)]) == 0
    assert b.unregister_memory(addr(dst)) == 0


def test_notifications_arrive_after_the_bytes(engine_pair):
    a, b, target = engine_pair
    src, dst = pattern(8192, 2), np.zeros(8192, dtype=np.uint8)
    a.register_memory(addr(src), src.nbytes)
    b.register_memory(addr(dst), dst.nbytes)
    note = TransferNotify(f"127.0.0.1:{a.get_rpc_port()}", "room-7 done")
    assert a.transfer_sync(target, addr(src), addr(dst), 4096, TransferOpcode.Write, note) == 0
    assert a.batch_transfer_sync(target, [addr(src) + 4096], [addr(dst) + 4096], [4096],
                                 TransferOpcode.Write, TransferNotify("x", "second")) == 0
    got = wait_until(lambda: b.get_notifies() or None)
    got += b.get_notifies()
    assert [(n.name, n.msg) for n in got] == [(note.name, "room-7 done"), ("x", "second")]
    assert (dst == src).all()
    assert b.get_notifies() == []


def test_managed_buffers_bytes_and_first_buffer(engine_pair):
    a, b, target = engine_pair
    assert b.get_first_buffer_address(target) == 0
    buf = b.allocate_managed_buffer(MiB)
    assert buf != 0
    assert b.get_first_buffer_address(target) == buf
    assert a.get_first_buffer_address(target) == buf  # seen by the peer

    mine = a.allocate_managed_buffer(4096)
    assert a.write_bytes_to_buffer(mine, b"hello moongate", 14) == 0
    assert a.read_bytes_from_buffer(mine, 5) == b"hello"
    assert a.transfer_sync_write(target, mine, buf + 100, 14) == 0
    assert b.read_bytes_from_buffer(buf + 100, 14) == b"hello moongate"
    assert a.write_bytes_to_buffer(mine, "text too", 4) == 0
    assert a.read_bytes_from_buffer(mine, 4) == b"text"
    assert a.free_managed_buffer(mine, 4096) == 0
    assert a.free_managed_buffer(mine, 4096) == -1
    assert b.free_managed_buffer(buf, MiB) == 0


def test_probe_topology_engine_and_metadata_server(engine_pair, master):
    a, _, target = engine_pair
    assert a.send_probe(target) == 0
    assert a.send_probe("127.0.0.1:1") != 0
    assert a.send_probe("unreachable_peer:9") != 0
    assert '"rdma"' in a.get_local_topology()
    assert isinstance(a.get_engine(), InnerTransferEngine)
    assert a.get_engine_ptr() != 0
    assert a.warmup_efa_segment(target) == 0

    # Mooncake's HTTP metadata protocol, served by `moongate master`: names as given.
    t, i = TransferEngine(), TransferEngine()
    assert t.initialize("127.0.0.1:12345", master.metadata, "tcp", "") == 0
    assert i.initialize("127.0.0.1:12347", master.metadata, "tcp", "") == 0
    dst = t.allocate_managed_buffer(MiB)
    src = i.allocate_managed_buffer(MiB)
    assert i.get_first_buffer_address("127.0.0.1:12345") == dst
    assert i.write_bytes_to_buffer(src, b"via metadata", 12) == 0
    assert i.transfer_sync_write("127.0.0.1:12345", src, dst, 12) == 0
    assert t.read_bytes_from_buffer(dst, 12) == b"via metadata"
    assert i.send_probe("127.0.0.1:12345") == 0
    assert i.batch_transfer_async_write("unreachable_peer:9", [0], [0], [16]) == 0
    assert i.transfer_submit_write("unreachable_peer:9", 0, 0, 16) == 0


def test_rdma_without_a_device_runs_over_tcp(engine_pair):
    """SGLang's default protocol is rdma; with no usable device the engine falls back (and
    logs it), as Mooncake does with MC_FORCE_TCP."""
    _, b, target = engine_pair
    e = TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "") == 0
    src, dst = pattern(4096, 8), np.zeros(4096, dtype=np.uint8)
    assert e.register_memory(addr(src), src.nbytes) == 0
    assert b.register_memory(addr(dst), dst.nbytes) == 0
    assert e.transfer_sync_write(target, addr(src), addr(dst), 4096) == 0
    assert (dst == src).all()


def test_threads_share_one_engine(engine_pair):
    """Many Python threads move bytes through one engine at once (the GIL is released
    while they wait, so they overlap); every byte lands where its thread aimed it."""
    a, b, target = engine_pair
    n, chunk = 8, 256 * 1024
    src, dst = pattern(n * chunk, 3), np.zeros(n * chunk, dtype=np.uint8)
    a.register_memory(addr(src), src.nbytes)
    b.register_memory(addr(dst), dst.nbytes)
    errors = []

    def work(k):
        for _ in range(20):
            off = k * chunk
            rc = a.batch_transfer_sync_write(target, [addr(src) + off], [addr(dst) + off], [chunk])
            if rc != 0:
                errors.append(rc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert (dst == src).all()


def test_bad_input_is_answered_never_crashes(engine_pair):
    a, b, target = engine_pair
    fresh = TransferEngine()
    # Not initialized: -1 / 0 / exceptions, as the return type allows.
    assert fresh.get_rpc_port() == -1
    assert fresh.register_memory(1, 1) == -1
    assert fresh.transfer_sync_write(target, 1, 1, 1) == -1
    assert fresh.allocate_managed_buffer(10) == 0
    assert fresh.get_notifies() == []
    with pytest.raises(RuntimeError):
        fresh.read_bytes_from_buffer(1, 1)
    with pytest.raises(RuntimeError):
        fresh.get_engine()
    # Bad initialization.
    assert fresh.initialize("127.0.0.1", "127.0.0.1:2379", "tcp", "") == -1  # etcd
    assert fresh.initialize("127.0.0.1", "P2PHANDSHAKE", "nvlink", "") == -1
    assert fresh.initialize_ext("127.0.0.1", "m:1", "tcp", "", "redis") == -1
    assert a.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == -1  # twice

    src, dst = pattern(8192, 4), np.zeros(8192, dtype=np.uint8)
    # Null, made-up, read-only and overlapping registrations.
    assert a.register_memory(0, 4096) == -1
    assert a.register_memory(addr(src), 0) == -1
    assert a.register_memory(0x1000, 4096) == -1
    assert a.register_memory(2**64 - 4096, 8192) == -1
    ro_map = mmap.mmap(-1, 4096, prot=mmap.PROT_READ)
    assert a.register_memory(addr(np.frombuffer(ro_map, dtype=np.uint8)), 4096) == -1
    assert a.register_memory(addr(src), src.nbytes) == 0
    assert a.register_memory(addr(src) + 100, 10) == -1
    assert a.unregister_memory(addr(src) + 1) == -1
    # Mooncake's location labels: host memory as cpu:N or `*`; a host pointer labelled as
    # device memory, and unknown labels, are refused (with or without a CUDA driver here).
    loc = [np.zeros(4096, dtype=np.uint8) for _ in range(3)]
    assert a.register_memory(addr(loc[0]), 4096, "cpu:0") == 0
    assert a.register_memory(addr(loc[1]), 4096, "*") == 0
    assert a.register_memory(addr(loc[2]), 4096, "cuda:0") == -1
    assert a.register_memory(addr(loc[2]), 4096, "npu:0") == -1
    assert a.register_memory(addr(loc[2]), 4096, "cuda:x") == -1
    assert a.batch_register_memory([addr(loc[2])], [4096], "cuda:0") == -1
    assert a.batch_unregister_memory([addr(loc[0]), addr(loc[1])]) == 0
    assert b.register_memory(addr(dst), dst.nbytes) == 0

    # Local side not registered, or running past its registration.
    other = np.zeros(4096, dtype=np.uint8)
    assert a.transfer_sync_write(target, addr(other), addr(dst), 16) == -1
    assert a.transfer_sync_write(target, addr(src), addr(dst), src.nbytes + 1) == -1
    # Remote side outside the peer's registered memory: refused by the peer.
    assert a.transfer_sync_write(target, addr(src), addr(dst) + 8000, 4096) == -1
    assert a.transfer_sync_write(target, addr(src), 0x1000, 16) == -1
    assert a.transfer_sync_read(target, addr(src), addr(dst) - 4096, 16) == -1
    # Unknown peers, mismatched lists, unknown batch ids.
    assert a.transfer_sync_write("127.0.0.1:1", addr(src), addr(dst), 16) == -1
    assert a.batch_transfer_sync_write(target, [addr(src)], [addr(dst), 1], [16]) == -1
    assert a.batch_transfer_async_write(target, [addr(src)], [], [16]) == 0
    assert a.get_batch_transfer_status([12345678]) == -1
    assert a.transfer_check_status(12345678) == -1
    # Bytes helpers outside registered memory, or longer than given.
    with pytest.raises(ValueError):
        a.read_bytes_from_buffer(addr(other), 16)
    assert a.write_bytes_to_buffer(addr(other), b"x", 1) == -1
    assert a.write_bytes_to_buffer(addr(src), b"abc", 4) == -1
    # Wrong types: Python exceptions, as pybind11 raises them.
    with pytest.raises(TypeError):
        a.transfer_sync_write(target, "not an address", addr(dst), 16)
    with pytest.raises(TypeError):
        a.batch_transfer_sync_write(target, addr(src), [addr(dst)], [16])
    with pytest.raises(TypeError):
        a.write_bytes_to_buffer(addr(src), 123, 1)
    with pytest.raises((TypeError, OverflowError)):
        a.register_memory(-1, 16)
    # Nothing above broke the engine.
    assert a.transfer_sync_write(target, addr(src), addr(dst), 8192) == 0
    assert (dst == src).all()
