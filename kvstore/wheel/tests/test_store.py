"""`mooncake.store.MooncakeDistributedStore` against a real `moongate master`: every method
with Mooncake's return codes, and bad input (wrong types, unregistered or null pointers,
sizes past a buffer, a closed store, a dead master)."""

import ctypes
import gc
import os
import signal
import threading
import time

import numpy as np
import pytest

from conftest import MiB, Master, new_store, remove_when_unleased, wait_until
from mooncake.store import MooncakeDistributedStore, ReplicateConfig, SoftPinAction

NOT_FOUND, INVALID, HAS_LEASE = -704, -600, -706


def addr(a: np.ndarray) -> int:
    return a.ctypes.data


def test_put_get_exist_size_remove(store):
    assert store.put("k1", b"hello") == 0
    assert store.put("k1", b"hello") == 0  # an existing key: done
    assert store.get("k1") == b"hello"
    assert store.get("missing") == b""
    assert store.is_exist("k1") == 1
    assert store.is_exist("missing") == 0
    assert store.get_size("k1") == 5
    assert store.get_size("missing") == NOT_FOUND
    assert store.batch_is_exist(["k1", "missing", "k1"]) == [1, 0, 1]
    assert store.batch_is_exist([]) == []
    assert store.put("k2", bytearray(b"ba")) == 0
    assert store.put("k3", memoryview(b"mv")) == 0
    assert store.put("k4", np.arange(4, dtype=np.uint8)) == 0
    assert store.get_batch(["k2", "k3", "k4", "nope"]) == [b"ba", b"mv", bytes(range(4)), b""]
    assert store.put_batch(["b1", "b2"], [b"x" * 100, b"y" * 200]) == 0
    assert store.get("b2") == b"y" * 200
    # A read lease keeps an object until it runs out (or `force`).
    assert store.remove("k1") in (0, HAS_LEASE)
    remove_when_unleased(store, "k1") if store.is_exist("k1") == 1 else None
    assert store.is_exist("k1") == 0
    assert store.remove("k1") == NOT_FOUND
    assert store.remove("k2", force=True) == 0
    assert wait_until(lambda: store.batch_remove(["k3", "k4", "zz"]) [:2] == [0, 0] or None)
    assert store.batch_remove(["zz"]) == [NOT_FOUND]


def test_buffers_handles_and_removal_by_pattern(store):
    assert store.put("buf-a", b"A" * 3000) == 0
    h = store.get_buffer("buf-a")
    assert h.size() == 3000 and len(h) == 3000 and h.ptr() != 0
    assert bytes(h) == b"A" * 3000
    assert store.get_buffer("nope") is None
    hs = store.batch_get_buffer(["buf-a", "nope"])
    assert bytes(hs[0]) == b"A" * 3000 and hs[1] is None
    assert store.batch_get_buffer([]) == []
    for i in range(5):
        assert store.put(f"re-{i}", b"v") == 0
    assert store.put("keep", b"v") == 0
    assert wait_until(lambda: store.remove_by_regex("^re-") == 5 or None, 5)
    assert store.remove_by_regex("(") == INVALID
    assert store.is_exist("keep") == 1
    # `is_exist` leased "keep": remove_all takes it once the lease ran out.
    wait_until(lambda: store.remove_all() >= 0 and store.remove("keep") == NOT_FOUND, 5, "remove_all")


def test_zero_copy_batches_and_ranges(store):
    pool = np.zeros(4 * MiB, dtype=np.uint8)
    pool[: 2 * MiB] = np.random.default_rng(5).integers(0, 256, 2 * MiB, dtype=np.uint8)
    assert store.register_buffer(addr(pool), pool.nbytes) == 0
    base = addr(pool)
    assert store.put_from("z0", base, 4096) == 0
    assert store.get_into("z0", base + 3 * MiB, 8192) == 4096
    assert (pool[3 * MiB:3 * MiB + 4096] == pool[:4096]).all()
    keys = [f"zb{i}" for i in range(8)]
    rs = store.batch_put_from(keys, [base + i * 65536 for i in range(8)], [65536] * 8)
    assert rs == [0] * 8
    got = store.batch_get_into(keys, [base + 2 * MiB + i * 65536 for i in range(8)], [65536] * 8)
    assert got == [65536] * 8
    assert (pool[2 * MiB:2 * MiB + 8 * 65536] == pool[: 8 * 65536]).all()
    # Multi-buffer objects: the concatenation of their pieces.
    rs = store.batch_put_from_multi_buffers(["mb"], [[base, base + 100_000]], [[1000, 24]])
    assert rs == [0]
    assert store.get("mb") == bytes(pool[:1000]) + bytes(pool[100_000:100_024])
    out = [base + 3 * MiB + 500_000, base + 3 * MiB + 600_000]
    assert store.batch_get_into_multi_buffers(["mb"], [out], [[24, 1000]]) == [1024]
    assert bytes(pool[3 * MiB + 500_000:3 * MiB + 500_024]) == bytes(pool[:24])
    # Ranged reads (Mooncake's test shapes).
    assert store.put("r1", b"0123456789ABCDEF") == 0
    r = store.get_into_ranges([base + 3 * MiB], [["r1", "nope"]], [[[0, 8], [0]]], [[[1, 10], [0]]], [[[4, 2], [4]]])
    assert r[0][0] == [4, 2] and r[0][1][0] < 0
    assert bytes(pool[3 * MiB:3 * MiB + 4]) == b"1234" and bytes(pool[3 * MiB + 8:3 * MiB + 10]) == b"AB"
    assert store.get_into_ranges([base], [["r1"]], [[[0]]], [[[15]]], [[[4]]])[0][0][0] < 0
    # Upserts replace; a live read lease (the reads above) refuses them until it runs out.
    assert store.upsert("fresh", b"1") == 0 and store.upsert("fresh", b"2") == 0
    assert store.upsert("r1", b"new") in (0, HAS_LEASE)
    wait_until(lambda: store.upsert("r1", b"newer") == 0 or None, 5, "upsert")
    assert store.get("r1") == b"newer"
    wait_until(lambda: store.upsert_from("r1", base, 16) == 0 or None, 5, "upsert_from")
    assert store.get("r1") == bytes(pool[:16])
    wait_until(lambda: store.batch_upsert_from(["r1"], [base], [8]) == [0] or None, 5, "batch_upsert_from")
    wait_until(lambda: store.upsert_batch(["r1", "r2"], [b"1", b"2"]) == 0 or None, 5, "upsert_batch")
    assert store.get_batch(["r1", "r2"]) == [b"1", b"2"]
    assert store.unregister_buffer(addr(pool)) == 0
    assert store.unregister_buffer(addr(pool)) == INVALID


def test_replicate_config(store):
    c = ReplicateConfig()
    assert c.replica_num == 1 and c.soft_pin_ttl_ms is None
    c.replica_num = 2
    c.with_hard_pin = True
    c.preferred_segment = store.get_hostname()
    c.preferred_segments = ["other:1"]
    c.soft_pin_action = SoftPinAction.ENABLE
    c.soft_pin_ttl_ms = 1000
    assert "2" in str(c)
    assert store.put("placed", b"p", c) == 0
    with pytest.raises(TypeError):
        c.soft_pin_ttl_ms = -1
    with pytest.raises(TypeError):
        c.soft_pin_ttl_ms = 1 << 64
    c.soft_pin_ttl_ms = None
    ttl_only = ReplicateConfig()
    ttl_only.soft_pin_ttl_ms = 10
    assert store.put("ttl-only", b"x", ttl_only) == INVALID
    for f in ("nof_replica_num", "dfs_replica_num", "preferred_nof_segments",
              "prefer_alloc_in_same_node", "data_type", "group_ids"):
        assert hasattr(c, f)
    assert store.get_hostname().startswith("127.0.0.1:")
    assert store.health_check() == 0


def test_setup_forms_and_refusals(master):
    s = MooncakeDistributedStore()
    cfg = {"local_hostname": "localhost", "metadata_server": "P2PHANDSHAKE",
           "global_segment_size": "16MB", "local_buffer_size": "16 MB",
           "protocol": "tcp", "rdma_devices": "", "master_server_addr": master.addr}
    assert s.setup(cfg) == 0
    host = s.get_hostname()
    assert host.startswith("localhost:") and 12300 <= int(host.split(":")[1]) <= 14300
    assert s.put("dict-form", b"ok") == 0 and s.get("dict-form") == b"ok"
    assert s.setup(cfg) == INVALID  # twice
    assert s.close() == 0
    assert s.close() == 0
    assert s.setup({**cfg, "global_segment_size": "50%"}) == INVALID
    assert s.setup({**cfg, "metadata_server": "127.0.0.1:2379"}) == INVALID
    assert s.setup({**cfg, "protocol": "nvlink"}) == INVALID
    assert s.setup({"local_hostname": "x"}) == INVALID
    # No local store process at that address: the master is unreachable (RPC_FAIL).
    assert s.setup_dummy(1 << 20, 1 << 20, "127.0.0.1:9") == -900
    assert s.setup_dummy(0, 1 << 20, "127.0.0.1:9") == INVALID
    # SGLang's keyword retry: unknown keywords raise TypeError naming them.
    args = ("127.0.0.1", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "tcp", "", master.addr, None)
    with pytest.raises(TypeError, match="no_such_option"):
        s.setup(*args, no_such_option=True)
    assert s.setup(*args, tenant_id="other") == INVALID
    # SGLang passes its shared engine (`get_engine()`); the store runs its own.
    from mooncake.engine import TransferEngine

    te = TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    assert s.setup(*args[:7], te.get_engine(), enable_client_http_server=True) == 0
    assert s.put("with-engine", b"e") == 0 and s.close() == 0
    # A disk tier needs an absolute directory (test_ssd_offload.py has the rest).
    assert s.setup(*args, enable_ssd_offload=True, ssd_offload_path="ssd") == INVALID
    with pytest.raises(TypeError):
        s.setup("127.0.0.1", "P2PHANDSHAKE")
    # A zero copy buffer: the copying forms fail, the zero-copy ones work.
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 16 * MiB, 0, "tcp", "", master.addr) == 0
    assert s.put("zero-buf", b"data") != 0
    assert s.is_exist("zero-buf") == 0
    assert s.close() == 0


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kib * 1024


def test_a_store_freed_without_close_leaves_the_master(master):
    """Mooncake's store leaves when its object is freed (its destructor tears the client
    down), and Mooncake's own tests drop stores without `close`. A freed store must unmount
    its segment then, not at the client TTL: until then the master would go on placing
    other clients' values in a segment nobody serves."""
    names = lambda: {s["name"] for s in master.segments()["segments"]}  # noqa: E731
    before = names()
    s = new_store(master)
    mine = names() - before
    assert len(mine) == 1, mine
    assert s.put("freed-store", b"v") == 0
    del s
    gc.collect()  # CPython frees it at `del` already; the collect only makes sure
    # At once: the object's deallocation waited for the master's answer.
    assert not (names() & mine), names()
    other = new_store(master, segment=0)
    try:
        assert other.get("freed-store") == b""  # its objects went with its segment
    finally:
        assert other.close() == 0


def test_a_store_freed_while_its_master_hangs_lets_go_in_time():
    """Freeing runs with the GIL held: against a master that accepts connections and never
    answers (stopped with SIGSTOP), it must give up after its bound (2 s), not hold every
    Python thread for the whole master-call timeout (10 s)."""
    m = Master()
    try:
        s = new_store(m)
        os.kill(m.p.pid, signal.SIGSTOP)
        t = time.monotonic()
        del s
        gc.collect()
        took = time.monotonic() - t
        assert took < 6, f"freeing took {took:.1f} s"
    finally:
        os.kill(m.p.pid, signal.SIGCONT)
        m.stop()


def test_waiting_for_resident_memory(master):
    # Moongate's own: setup faults the segment in on idle-priority threads after it returns.
    before = rss_bytes()
    s = new_store(master, segment=512 * MiB)
    try:
        assert s.wait_memory_resident(0) is False, "512 MiB faulted in before setup returned"
        assert s.wait_memory_resident(120) is True
        assert rss_bytes() - before >= 512 * MiB
        assert s.wait_memory_resident(0) is True
        assert s.wait_memory_resident(1e19) is True  # past any deadline: no overflow
        for bad in (-1, float("nan"), float("inf"), 1e300):
            with pytest.raises(ValueError):
                s.wait_memory_resident(bad)
        with pytest.raises(TypeError):
            s.wait_memory_resident("soon")
    finally:
        assert s.close() == 0


def test_closed_store_and_bad_arguments(store, master):
    closed = MooncakeDistributedStore()
    assert closed.put("k", b"v") == INVALID
    assert closed.get("k") == b""
    assert closed.is_exist("k") == INVALID
    assert closed.batch_is_exist(["a", "b"]) == [INVALID, INVALID]
    assert closed.get_size("k") == INVALID
    assert closed.register_buffer(1, 1) == INVALID
    assert closed.batch_put_from(["a"], [1], [1]) == [INVALID]
    assert closed.remove_all() == INVALID
    assert closed.health_check() == 1
    assert closed.get_hostname() == ""

    buf = (ctypes.c_ubyte * 8192)()
    p = ctypes.addressof(buf)
    assert store.put_from("u", p, 16) == INVALID  # not registered
    assert store.register_buffer(0, 16) == INVALID
    assert store.register_buffer(0x1000, 4096) == INVALID
    assert store.register_buffer(p, 8192) == 0
    assert store.register_buffer(p + 8, 8) == INVALID  # overlaps
    assert store.put_from("u", p, 8193) == INVALID  # past the buffer
    assert store.get_into("u", p, 16) == NOT_FOUND
    assert store.put_from("u", p, 4096) == 0
    assert store.get_into("u", p + 4096, 100) < 0  # too small
    assert store.batch_put_from(["a", "b"], [p], [1, 2]) == [INVALID, INVALID]
    assert store.batch_get_into(["u"], [p + 8000], [4096]) == [INVALID]
    with pytest.raises(TypeError):
        store.put("k", 12345)
    with pytest.raises(TypeError):
        store.put(12345, b"v")
    with pytest.raises(TypeError):
        store.batch_put_from("abc", [p], [1])
    assert store.put("", b"v") != 0
    assert store.put("empty", b"") != 0
    assert store.unregister_buffer(p) == 0


def test_dead_master_and_threads(master):
    m = Master()
    s = new_store(m)
    pool = np.zeros(1 * MiB, dtype=np.uint8)
    assert s.register_buffer(addr(pool), pool.nbytes) == 0
    errors = []

    def work(k):
        for i in range(20):
            if s.put_from(f"t{k}-{i}", addr(pool) + k * 4096, 4096) != 0:
                errors.append((k, i))
            # Master-only calls run on this thread's own runtime and connection, between
            # puts on the shared runtime.
            if s.batch_is_exist([f"t{k}-{i}", f"t{k}-absent"]) != [1, 0]:
                errors.append((k, i, "batch_is_exist"))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert s.batch_is_exist([f"t{k}-19" for k in range(8)]) == [1] * 8
    m.stop()
    assert s.put("after", b"v") == -900  # RPC_FAIL
    assert s.get("after") == b""
    assert s.is_exist("after") == -900
    got = []
    t = threading.Thread(target=lambda: got.append(s.is_exist("t0-0")))
    t.start()
    t.join(30)
    assert got == [-900], "another thread's own connection sees the dead master too"
    assert wait_until(lambda: s.health_check() == 2, 10, "health_check to see the dead master")
    s.close()


def test_one_object_from_several_pieces(store):
    import numpy as np

    assert store.put_parts("parts", b"ab", bytearray(b"cd"), memoryview(b"ef")) == 0
    assert store.get("parts") == b"abcdef"
    assert store.put_parts("parts", b"zz") == 0  # exists: kept, as a put of it is
    assert store.get("parts") == b"abcdef"
    # Replaced once the read lease of the gets above has run out.
    wait_until(lambda: store.upsert_parts("parts", b"x", b"y") == 0, 5, "the lease to end")
    assert store.get("parts") == b"xy"
    with pytest.raises(TypeError):
        store.put_parts("parts", 5)
    buf = np.frombuffer(b"META" + b"d" * 60, dtype=np.uint8).copy()
    assert store.register_buffer(buf.ctypes.data, buf.nbytes) == 0
    base = buf.ctypes.data
    assert store.put_from_with_metadata("with-meta", base + 4, base, 60, 4) == 0
    assert store.get("with-meta") == b"META" + b"d" * 60
    assert store.put_from_with_metadata("empty", base + 4, base, 0, 4) == 0
    assert store.is_exist("empty") == 0
    assert store.put_from_with_metadata("unregistered", 8, 16, 4, 4) == -600
    assert store.unregister_buffer(buf.ctypes.data) == 0
