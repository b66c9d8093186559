"""Python and Rust on one cluster: bytes a Python store puts are served by a `moongate
store` node and read by the Rust `StoreClient` (the `kv` example), and the reverse; a
Python `TransferEngine` and a Rust engine (`transfer-bench`) move bytes both ways."""

import subprocess
import threading

import numpy as np

from conftest import Master, MiB, Proc, binary, new_store, wait_until


def kv(master, *args):
    out = subprocess.run(
        [str(binary("MOONGATE_KV_BIN", "examples/kv")), "--master", master.url,
         "--segment-size", "0", "--listen", "127.0.0.1:0", *args],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_store_bytes_cross_between_python_rust_and_a_storage_node():
    # A master with a 5 s read lease (10 s by default): each `kv` reader is a new process whose first
    # connection to the node (a debug build's authenticated handshake) starts after its
    # lookup, and on a slow machine outlasted the shared fixture's 300 ms lease.
    master = Master(lease_ttl_ms=5000)
    node = Proc([binary("MOONGATE_BIN", "moongate"), "store", "--master", master.url,
                 "--segment-size", "32M", "--listen", "127.0.0.1:0", "--protocol", "tcp",
                 "--http-listen", "127.0.0.1:0"],
                r"moongate store ready: segment (\S+) .* mounted true")
    try:
        assert node.match.group(1) in [s["name"] for s in master.segments()["segments"]]
        # A pure Python client (no segment): what it puts lands on the node.
        py = new_store(master, segment=0)
        value = np.random.default_rng(9).integers(0, 256, 300_000, dtype=np.uint8).tobytes()
        assert py.put("py-to-rust", value) == 0
        assert bytes.fromhex(kv(master, "get", "py-to-rust")) == value
        kv(master, "put", "rust-to-py", value[:1000].hex())
        assert py.get("rust-to-py") == value[:1000]
        pool = np.zeros(MiB, dtype=np.uint8)
        assert py.register_buffer(pool.ctypes.data, pool.nbytes) == 0
        assert py.get_into("rust-to-py", pool.ctypes.data, pool.nbytes) == 1000
        assert pool[:1000].tobytes() == value[:1000]
        assert py.close() == 0
    finally:
        node.stop()
        master.stop()


def test_connections_one_thread_opened_serve_another_while_it_is_away():
    """A store call runs on its thread's own runtime; the connections to a node that it
    opens live on the shared one. So a thread that opened them and then went back to Python
    (here: waiting on an event) does not hold up another thread's puts and gets over them."""
    master = Master()
    node = Proc([binary("MOONGATE_BIN", "moongate"), "store", "--master", master.url,
                 "--segment-size", "32M", "--listen", "127.0.0.1:0", "--protocol", "tcp",
                 "--http-listen", "127.0.0.1:0"],
                r"moongate store ready: segment (\S+) .* mounted true")
    try:
        py = new_store(master, segment=0)  # every value on the node, over TCP
        value = bytes(range(256)) * 4096
        opened, away, errors = threading.Event(), threading.Event(), []

        def opener():
            try:
                assert py.put("opened-by-a", value) == 0
                assert py.get("opened-by-a") == value
            except BaseException as e:  # reported by the main thread
                errors.append(e)
            opened.set()
            away.wait(60)

        a = threading.Thread(target=opener)
        a.start()
        try:
            assert opened.wait(30) and not errors, errors
            got = []
            b = threading.Thread(target=lambda: got.append(
                (py.put("from-b", value), py.get("from-b"), py.get("opened-by-a"))))
            b.start()
            b.join(20)
            assert not b.is_alive(), "the other thread's calls waited for the first thread"
            assert got == [(0, value, value)]
        finally:
            away.set()
            a.join(10)
        assert py.close() == 0
    finally:
        node.stop()
        master.stop()


def test_python_and_rust_engines_move_bytes_both_ways():
    from mooncake.engine import TransferEngine

    bench = binary("MOONGATE_TRANSFER_BENCH_BIN", "transfer-bench")
    # Rust target, Python initiator: write then read back through the Rust engine.
    target = Proc([bench, "--mode", "target", "--listen", "127.0.0.1:0", "--buffer-size", "16M"],
                  r"segment (\S+) buffer (0x[0-9a-f]+) len (\d+)")
    try:
        seg, remote = target.match.group(1), int(target.match.group(2), 16)
        e = TransferEngine()
        assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        assert e.get_first_buffer_address(seg) == remote
        src = np.random.default_rng(3).integers(0, 256, 4 * MiB, dtype=np.uint8)
        back = np.zeros_like(src)
        assert e.batch_register_memory([src.ctypes.data, back.ctypes.data], [src.nbytes, back.nbytes]) == 0
        assert e.batch_transfer_sync_write(seg, [src.ctypes.data], [remote + MiB], [src.nbytes]) == 0
        assert e.batch_transfer_sync_read(seg, [back.ctypes.data], [remote + MiB], [back.nbytes]) == 0
        assert (back == src).all()
    finally:
        target.stop()
    # Python target, Rust initiator: it writes, reads back and verifies every byte.
    t = TransferEngine()
    assert t.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    buf = t.allocate_managed_buffer(16 * MiB)
    assert buf != 0
    run = subprocess.run(
        [str(bench), "--mode", "initiator", "--segment", f"127.0.0.1:{t.get_rpc_port()}",
         "--listen", "127.0.0.1:0", "--block-size", "1M", "--buffer-size", "16M",
         "--duration", "1"],
        capture_output=True, text=True, timeout=60,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "verif" in (run.stdout + run.stderr).lower()
    assert any(t.read_bytes_from_buffer(buf, MiB))
