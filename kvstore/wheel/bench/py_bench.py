#!/usr/bin/env python3
"""The issue's Python figures, written against Mooncake's API only, so the very same script
runs on Mooncake's wheel and on Moongate's (py_bench.sh runs it in both venvs, in turn):

  py_bench.py store --metadata URL|P2PHANDSHAKE --master host:port [--rounds 5]
      batch_put_from / batch_get_into of 64 x 4 KiB and 64 x 1 MiB values from and into a
      registered numpy pool (the bench client holds the segment, protocol tcp), SGLang's
      layer-wise load (a get session, 61 ranged reads of 64 pages x 16 KiB), and
      batch_is_exist of 128 keys.
  py_bench.py standalone --client host:port --metadata URL|P2PHANDSHAKE --master host:port
      64 x 1 MiB batch_get_into on a setup_dummy client beside the local store process
      (mooncake_client) at --client, then on a full client holding its own segment;
      with --clients N, N dummy clients in their own processes reading at once (aggregate).
  py_bench.py te [--rounds 10]
      batch_transfer_sync_write of 64 MiB (64 x 1 MiB) into a target process (P2PHANDSHAKE,
      tcp), then a read-back check.

Prints one `RESULT {json}` line per figure: the median over rounds (GB/s, or ms per call).
"""
import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

K, M, G = 1 << 10, 1 << 20, 1 << 30
BATCH = 64


def emit(**d):
    print("RESULT " + json.dumps(d), flush=True)


def wheel():
    import mooncake

    return "moongate" if getattr(mooncake, "__moongate__", False) else "mooncake"


def store_bench(a):
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", a.metadata, 2 * G, 64 * M, "tcp", "", a.master)
    if rc != 0:
        raise SystemExit(f"setup -> {rc}")
    # Moongate's client faults its segment and buffers in on idle-priority threads after
    # setup; time it once that is done, as the Rust store-bench does (an SGLang process
    # loads its model for far longer). Mooncake's has nothing of the kind: its puts fault
    # their pages in as they go.
    wait = getattr(s, "wait_memory_resident", None)
    if wait is not None:
        t = time.perf_counter()
        done = wait(120)
        print(f"memory resident {'after' if done else 'still not after'} "
              f"{time.perf_counter() - t:.1f} s", file=sys.stderr)
    tag = f"{os.getpid()}-{time.time_ns()}"
    pool = np.ones(2 * BATCH * M, dtype=np.uint8)
    assert s.register_buffer(pool.ctypes.data, pool.nbytes) == 0
    src, dst = pool.ctypes.data, pool.ctypes.data + BATCH * M
    words = pool.view(np.uint64)
    idx = np.arange(BATCH, dtype=np.uint64)
    try:
        for size in (4 * K, 1 * M):
            # Checked as the Rust store-bench checks (untimed): every value is one body with
            # its round and index stamped in its first and last 8 bytes, and each value read
            # is compared with them. A get that wrote nothing, or the wrong value, is caught
            # without clearing the destination between calls (which left 64 MiB dirty in the
            # cache for the next timed get, a cost the Rust bench has not).
            body = np.resize(np.arange(251, dtype=np.uint8), size)
            pool[: BATCH * size].reshape(BATCH, size)[:] = body
            head = (idx * size) // 8
            tail = head + size // 8 - 1
            got_values = pool[BATCH * M: BATCH * M + BATCH * size].reshape(BATCH, size)
            # All the puts, then all the gets of the same keys in the same order, as the
            # Rust store-bench does (a get right after the put of the same values measured
            # 12-15 GB/s at 1 MiB here where a get after all the puts measured 18-20).
            put, get = [], []
            keys = [[f"pb-{tag}-{size}-{r}-{i}" for i in range(BATCH)] for r in range(a.rounds)]
            for r in range(a.rounds):
                marks = (np.uint64(r) << np.uint64(32)) | idx
                words[head], words[tail] = marks, ~marks
                ptrs = [src + i * size for i in range(BATCH)]
                t = time.perf_counter()
                rs = s.batch_put_from(keys[r], ptrs, [size] * BATCH)
                put.append(time.perf_counter() - t)
                assert rs == [0] * BATCH, rs
            dwords = words[BATCH * M // 8:]
            for r in range(a.rounds):
                t = time.perf_counter()
                got = s.batch_get_into(keys[r], [dst + i * size for i in range(BATCH)], [size] * BATCH)
                get.append(time.perf_counter() - t)
                assert got == [size] * BATCH, got
                marks = (np.uint64(r) << np.uint64(32)) | idx
                assert np.array_equal(dwords[head], marks) and np.array_equal(dwords[tail], ~marks)
                assert all(np.array_equal(v[8:-8], body[8:-8]) for v in got_values)
            for op, times in (("batch_put_from", put), ("batch_get_into", get)):
                med = statistics.median(times)
                emit(wheel=wheel(), op=op, value_bytes=size, batch=BATCH,
                     GBps=round(size * BATCH / med / 1e9, 3), median_ms=round(med * 1e3, 3))
        layer_wise(s, a, tag, pool)
        keys = [f"pb-{tag}-{1 * M}-0-{i}" for i in range(BATCH)] + [f"absent-{i}" for i in range(BATCH)]
        times = []
        for _ in range(max(20, a.rounds * 4)):
            t = time.perf_counter()
            ex = s.batch_is_exist(keys)
            times.append(time.perf_counter() - t)
            assert ex == [1] * BATCH + [0] * BATCH, ex
        emit(wheel=wheel(), op="batch_is_exist", keys=len(keys),
             median_ms=round(statistics.median(times) * 1e3, 3))
    finally:
        s.close()


def layer_wise(s, a, tag, pool):
    """SGLang's layer-wise loader (mooncake_direct_linker): 64 pages of 61 layers x 16 KiB,
    one get session, one batch_get_into_multi_buffer_ranges per layer into a layer-major
    pool, the end. Timed from the session's start to its end."""
    layers, chunk = 61, 16 * K
    obj = layers * chunk
    src, dst = pool.ctypes.data, pool.ctypes.data + BATCH * M
    pool[: BATCH * obj] = np.resize(np.arange(241, dtype=np.uint8), BATCH * obj)
    keys = [f"pb-{tag}-lw-{i}" for i in range(BATCH)]
    assert s.batch_put_from(keys, [src + i * obj for i in range(BATCH)], [obj] * BATCH) == [0] * BATCH
    times, per_layer = [], []
    for _ in range(a.rounds):
        t = time.perf_counter()
        assert s.batch_get_session_start(keys) == [0] * BATCH
        for layer in range(layers):
            ptrs = [[dst + (layer * BATCH + i) * chunk] for i in range(BATCH)]
            tl = time.perf_counter()
            got = s.batch_get_into_multi_buffer_ranges(keys, ptrs, [[chunk]] * BATCH,
                                                       [[layer * chunk]] * BATCH)
            per_layer.append(time.perf_counter() - tl)
            assert got == [chunk] * BATCH, got
        s.batch_get_session_end(keys)
        times.append(time.perf_counter() - t)
        # Page 5's layer 7 landed where the loader put it.
        at = BATCH * M + (7 * BATCH + 5) * chunk
        assert np.array_equal(pool[at:at + chunk], pool[5 * obj + 7 * chunk:5 * obj + 8 * chunk])
    med = statistics.median(times)
    emit(wheel=wheel(), op="layer_wise_load", layers=layers, pages=BATCH, chunk_bytes=chunk,
         GBps=round(obj * BATCH / med / 1e9, 3), median_ms=round(med * 1e3, 3),
         layer_call_ms=round(statistics.median(per_layer) * 1e3, 3))


def standalone_bench(a):
    """64 x 1 MiB batch_get_into on a setup_dummy client beside the local store process at
    --client (its pool from MooncakeHostMemAllocator), then on a full client holding its
    own segment, in the same process and run."""
    from mooncake.store import MooncakeDistributedStore, MooncakeHostMemAllocator

    tag = f"{os.getpid()}-{time.time_ns()}"
    rows = {}
    for mode in ("dummy", "full"):
        s = MooncakeDistributedStore()
        if mode == "dummy":
            alloc = MooncakeHostMemAllocator()
            size = 2 * BATCH * M
            ptr = alloc.alloc(size)
            assert ptr, "alloc failed"
            rc = s.setup_dummy(size, 64 * M, a.client)
            assert rc == 0, f"setup_dummy -> {rc}"
        else:
            rc = s.setup("127.0.0.1", a.metadata, 2 * G, 64 * M, "tcp", "", a.master)
            assert rc == 0, f"setup -> {rc}"
            wait = getattr(s, "wait_memory_resident", None)
            if wait is not None:
                wait(120)
            pool = np.zeros(2 * BATCH * M, dtype=np.uint8)
            ptr = pool.ctypes.data
        assert s.register_buffer(ptr, 2 * BATCH * M) == 0
        src, dst = ptr, ptr + BATCH * M
        view = np.frombuffer((ctypes.c_byte * (2 * BATCH * M)).from_address(ptr), dtype=np.uint8)
        view[: BATCH * M] = np.resize(np.arange(239, dtype=np.uint8), BATCH * M)
        times = []
        for r in range(a.rounds):
            keys = [f"sb-{tag}-{mode}-{r}-{i}" for i in range(BATCH)]
            assert s.batch_put_from(keys, [src + i * M for i in range(BATCH)], [M] * BATCH) == [0] * BATCH
            t = time.perf_counter()
            got = s.batch_get_into(keys, [dst + i * M for i in range(BATCH)], [M] * BATCH)
            times.append(time.perf_counter() - t)
            assert got == [M] * BATCH, got
        assert np.array_equal(view[BATCH * M:], view[: BATCH * M])
        med = statistics.median(times)
        rows[mode] = M * BATCH / med / 1e9
        emit(wheel=wheel(), op=f"batch_get_into_{mode}", value_bytes=M, batch=BATCH,
             GBps=round(rows[mode], 3), median_ms=round(med * 1e3, 3))
        s.close()


def standalone_one(a):
    """One dummy client of `standalone --clients N`: sets up, puts its 64 values, says
    "ready", waits for a line on stdin, then times batch_get_into calls and prints
    `{"bytes", "seconds"}`."""
    from mooncake.store import MooncakeDistributedStore, MooncakeHostMemAllocator

    s = MooncakeDistributedStore()
    size = 2 * BATCH * M
    ptr = MooncakeHostMemAllocator().alloc(size)
    assert ptr and s.setup_dummy(size, 64 * M, a.client) == 0
    assert s.register_buffer(ptr, size) == 0
    keys = [f"sm-{os.getpid()}-{i}" for i in range(BATCH)]
    assert s.batch_put_from(keys, [ptr + i * M for i in range(BATCH)], [M] * BATCH) == [0] * BATCH
    dsts = [ptr + (BATCH + i) * M for i in range(BATCH)]
    assert s.batch_get_into(keys, dsts, [M] * BATCH) == [M] * BATCH  # warm
    print("ready", flush=True)
    sys.stdin.readline()
    t = time.perf_counter()
    for _ in range(a.rounds):
        assert s.batch_get_into(keys, dsts, [M] * BATCH) == [M] * BATCH
    print(json.dumps({"bytes": a.rounds * BATCH * M, "seconds": time.perf_counter() - t}),
          flush=True)
    sys.stdin.readline()
    s.close()


def standalone_many(a):
    """`--clients N` dummy clients beside one store process, each in its own process, all
    reading 64 x 1 MiB batches at once: the aggregate rate over the slowest client's time."""
    kids = [subprocess.Popen([sys.executable, __file__, "standalone-one", "--client", a.client,
                              "--rounds", str(a.rounds)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            for _ in range(a.clients)]
    try:
        for k in kids:
            assert k.stdout.readline().strip() == "ready"
        for k in kids:
            k.stdin.write("go\n")
            k.stdin.flush()
        done = [json.loads(k.stdout.readline()) for k in kids]
        total = sum(d["bytes"] for d in done)
        wall = max(d["seconds"] for d in done)
        emit(wheel=wheel(), op=f"batch_get_into_dummy_x{a.clients}", value_bytes=M, batch=BATCH,
             GBps=round(total / wall / 1e9, 3), median_ms=round(wall * 1e3, 3))
    finally:
        for k in kids:
            try:
                k.stdin.write("end\n")
                k.stdin.close()
            except OSError:
                pass
            k.wait(60)


def engine():
    from mooncake.engine import TransferEngine

    te = TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    return te, f"127.0.0.1:{te.get_rpc_port()}"


def te_target(a):
    te, session = engine()
    buf = np.zeros(BATCH * M, dtype=np.uint8)
    buf[::4096] = 1
    assert te.register_memory(buf.ctypes.data, buf.nbytes) == 0
    print(json.dumps({"session": session, "addr": buf.ctypes.data}), flush=True)
    sys.stdin.read()


def te_bench(a):
    p = subprocess.Popen([sys.executable, __file__, "te-target"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        peer = json.loads(p.stdout.readline())
        te, _ = engine()
        src = np.resize(np.arange(253, dtype=np.uint8), BATCH * M)
        assert te.register_memory(src.ctypes.data, src.nbytes) == 0
        srcs = [src.ctypes.data + i * M for i in range(BATCH)]
        dsts = [peer["addr"] + i * M for i in range(BATCH)]
        assert te.batch_transfer_sync_write(peer["session"], srcs, dsts, [M] * BATCH) == 0  # warm-up
        times = []
        for _ in range(a.rounds):
            t = time.perf_counter()
            rc = te.batch_transfer_sync_write(peer["session"], srcs, dsts, [M] * BATCH)
            times.append(time.perf_counter() - t)
            assert rc == 0
        back = np.zeros(M, dtype=np.uint8)
        assert te.register_memory(back.ctypes.data, back.nbytes) == 0
        assert te.transfer_sync_read(peer["session"], back.ctypes.data, dsts[-1], M) == 0
        assert np.array_equal(back, src[-M:])
        med = statistics.median(times)
        emit(wheel=wheel(), op="batch_transfer_sync_write", bytes=BATCH * M, batch=BATCH,
             GBps=round(BATCH * M / med / 1e9, 3), median_ms=round(med * 1e3, 3))
    finally:
        p.stdin.close()
        p.wait(30)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["store", "standalone", "standalone-one", "te", "te-target"])
    ap.add_argument("--metadata", default="P2PHANDSHAKE")
    ap.add_argument("--master", default="127.0.0.1:50051")
    ap.add_argument("--client", default="127.0.0.1:50052", help="the local store process")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--clients", type=int, default=0,
                    help="standalone: that many dummy clients at once instead")
    a = ap.parse_args()
    if a.what == "standalone" and a.clients:
        standalone_many(a)
    else:
        {"store": store_bench, "standalone": standalone_bench, "standalone-one": standalone_one,
         "te": te_bench, "te-target": te_target}[a.what](a)
