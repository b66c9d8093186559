"""SGLang HiCache's L3 calls (`mem_cache/storage/mooncake_store/mooncake_store.py`),
reproduced in its order and shapes without a GPU: a numpy array stands in for the host KV
pool (`page_first` layout: one page holds k then v of every layer)."""

import hashlib
import re
import time
import urllib.request
import uuid

import numpy as np
import pytest

from conftest import MiB

PAGE_TOKENS, KV_BYTES_PER_TOKEN = 16, 512
PAGE = PAGE_TOKENS * KV_BYTES_PER_TOKEN  # bytes of k (or of v) per page


def page_hashes(tokens, prefix=""):
    """SGLang's chained SHA-256 page keys."""
    out, prev = [], b""
    for i in range(0, len(tokens) - len(tokens) % PAGE_TOKENS, PAGE_TOKENS):
        h = hashlib.sha256(prev + np.asarray(tokens[i:i + PAGE_TOKENS], dtype=np.int64).tobytes())
        prev = h.digest()
        out.append(prefix + h.hexdigest())
    return out


def setup_like_sglang(store, master, setup_kwargs):
    """MooncakeStore.__init__'s setup call, with its retry on unsupported keywords."""
    while True:
        try:
            ret = store.setup("127.0.0.1", "P2PHANDSHAKE", 64 * MiB, 16 * MiB, "tcp", "",
                              master.addr, None, **setup_kwargs)
            break
        except TypeError as e:
            unsupported = [k for k in list(setup_kwargs) if k in str(e)]
            if not unsupported:
                raise
            for k in unsupported:
                setup_kwargs.pop(k)
    return ret, setup_kwargs


def warmup(store):
    key = "sglang_mooncake_store_warmup_key" + uuid.uuid4().hex
    value = bytes(4 * 1024)
    assert store.put(key, value) == 0
    assert store.is_exist(key) == 1
    assert store.get(key) == value


class HostPool:
    """A host KV pool: `pages` pages, each k then v; pointers as get_page_buffer_meta gives."""

    def __init__(self, pages):
        self.buf = np.zeros(pages * 2 * PAGE, dtype=np.uint8)

    def ptr(self, page, kv):
        return self.buf.ctypes.data + (page * 2 + kv) * PAGE

    def page(self, page):
        return self.buf[page * 2 * PAGE:(page + 1) * 2 * PAGE]


def batch_set(store, keys, pool, pages, suffix="0"):
    """batch_set_v1: batch_is_exist, then batch_put_from of the missing keys only."""
    key_strs, ptrs, sizes = [], [], []
    for k, p in zip(keys, pages):
        key_strs += [f"{k}_{suffix}_k", f"{k}_{suffix}_v"]
        ptrs += [pool.ptr(p, 0), pool.ptr(p, 1)]
        sizes += [PAGE, PAGE]
    exist = store.batch_is_exist(key_strs)
    results = [0 if e == 1 else -1 for e in exist]
    missing = [i for i, e in enumerate(exist) if e != 1]
    if missing:
        put = store.batch_put_from([key_strs[i] for i in missing], [ptrs[i] for i in missing],
                                   [sizes[i] for i in missing])
        for i, r in zip(missing, put):
            results[i] = r
    return [all(r == 0 for r in results[i:i + 2]) for i in range(0, len(results), 2)], len(missing)


def batch_exists(store, keys, suffix="0"):
    """batch_exists: the length of the stored prefix, in pages."""
    q = [s for k in keys for s in (f"{k}_{suffix}_k", f"{k}_{suffix}_v")]
    ex = store.batch_is_exist(q)
    for i, e in enumerate(ex):
        if e != 1:
            return i // 2
    return len(q) // 2


def batch_get(store, keys, pool, pages, suffix="0"):
    key_strs = [s for k in keys for s in (f"{k}_{suffix}_k", f"{k}_{suffix}_v")]
    ptrs = [pool.ptr(p, kv) for p in pages for kv in (0, 1)]
    got = store.batch_get_into(key_strs, ptrs, [PAGE] * len(key_strs))
    return [all(r > 0 for r in got[i:i + 2]) for i in range(0, len(got), 2)]


def test_hicache_backup_and_prefetch(master):
    from mooncake.store import MooncakeDistributedStore, ReplicateConfig

    # The import-time probe SGLang does for group semantics.
    assert hasattr(ReplicateConfig(), "group_ids")
    store = MooncakeDistributedStore()
    # Keywords this wheel accepts pass through; an unknown one is dropped by SGLang's retry.
    ret, kept = setup_like_sglang(store, master, {"enable_client_http_server": False,
                                                  "not_in_this_version": 1})
    assert ret == 0 and kept == {"enable_client_http_server": False}
    warmup(store)

    pool = HostPool(64)
    assert store.register_buffer(pool.buf.ctypes.data, pool.buf.nbytes) == 0
    rng = np.random.default_rng(11)
    tokens = rng.integers(0, 32000, 10 * PAGE_TOKENS).tolist()
    keys = page_hashes(tokens, prefix="Qwen-Qwen3-8B_")
    for i in range(10):
        pool.page(i)[:] = rng.integers(0, 256, 2 * PAGE, dtype=np.uint8)

    # Backup of the first 6 pages, then of all 10: only the 4 new ones are put.
    ok, puts = batch_set(store, keys[:6], pool, range(6))
    assert ok == [True] * 6 and puts == 12
    ok, puts = batch_set(store, keys, pool, range(10))
    assert ok == [True] * 10 and puts == 8
    assert batch_exists(store, keys) == 10
    other = page_hashes(tokens[:3 * PAGE_TOKENS] + [1] * 16, prefix="Qwen-Qwen3-8B_")
    assert batch_exists(store, other) == 3  # a shared prefix, then a miss

    # Prefetch into other pages of the pool, byte for byte.
    assert batch_get(store, keys, pool, range(20, 30)) == [True] * 10
    for i in range(10):
        assert (pool.page(20 + i) == pool.page(i)).all()
    missing = batch_get(store, ["nope"], pool, [40])
    assert missing == [False]

    # MLA: one object per page, `{hash}__k` (mla_suffix ""), layer-first multi-buffers.
    layers = 4
    mla = [np.zeros(32 * 1024, dtype=np.uint8) for _ in range(layers)]
    for b in mla:
        b[:] = rng.integers(0, 256, b.size, dtype=np.uint8)
        assert store.register_buffer(b.ctypes.data, b.nbytes) == 0
    item = 1024
    mla_keys = [f"{k}__k" for k in keys[:3]]
    ptrs = [[mla[layer].ctypes.data + p * item for layer in range(layers)] for p in range(3)]
    sizes = [[item] * layers for _ in range(3)]
    assert store.batch_is_exist(mla_keys) == [0, 0, 0]
    assert store.batch_put_from_multi_buffers(mla_keys, ptrs, sizes, ReplicateConfig()) == [0, 0, 0]
    dst = [[mla[layer].ctypes.data + (10 + p) * item for layer in range(layers)] for p in range(3)]
    assert store.batch_get_into_multi_buffers(mla_keys, dst, sizes) == [layers * item] * 3
    for layer in range(layers):
        assert (mla[layer][10 * item:13 * item] == mla[layer][:3 * item]).all()

    # clear(): remove_all; close() as the destructor would.
    assert store.remove_all() >= 0
    assert store.close() == 0


@pytest.mark.parametrize("tp", [0, 1])
def test_tensor_parallel_ranks_share_one_store(master, tp):
    """Two TP ranks write their halves under `_{tp}_k/_v`; each reads back its own."""
    from conftest import new_store

    s = new_store(master)
    pool = HostPool(4)
    pool.buf[:] = tp + 1
    assert s.register_buffer(pool.buf.ctypes.data, pool.buf.nbytes) == 0
    keys = page_hashes(list(range(2 * PAGE_TOKENS)), prefix=f"tp-test-{uuid.uuid4().hex}_")
    ok, _ = batch_set(s, keys, pool, [0, 1], suffix=str(tp))
    assert ok == [True, True]
    assert batch_get(s, keys, pool, [2, 3], suffix=str(tp)) == [True, True]
    assert (pool.buf == tp + 1).all()
    assert batch_exists(s, keys, suffix=str(1 - tp)) == 0
    s.close()


def sglang_check_server(master_server_address, metrics_port, timeout):
    """MooncakeStore.check_server with MOONCAKE_CHECK_SERVER=true: poll the master's
    `/get_all_segments` on its metrics port until the body is not empty."""
    ip, _, _ = master_server_address.partition(":")
    url = f"http://{ip}:{metrics_port}/get_all_segments"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=3) as r:
                text = r.read().decode()
        except OSError:
            time.sleep(0.05)
            continue
        if text == "":
            time.sleep(0.05)
            continue
        return text
    return None


def test_check_server_waits_for_a_mounted_segment():
    from conftest import Master, new_store

    m = Master("--mooncake-http-port", "0")
    try:
        port = re.search(r"Mooncake's master HTTP service listening addr=\S+:(\d+)",
                         m.text()).group(1)
        # Nothing mounted yet: SGLang keeps waiting.
        assert sglang_check_server(m.addr, port, 0.3) is None
        # A store (the standalone store process, or another worker) mounts its segment.
        other = new_store(m)
        try:
            listed = sglang_check_server(m.addr, port, 5)
            assert listed is not None and listed.endswith("\n")
            assert listed.splitlines() == [s["name"] for s in m.segments()["segments"]]
            # Then SGLang sets its own store up and warms it up.
            store = sglang_store(m)
            warmup(store)
            assert len(sglang_check_server(m.addr, port, 5).splitlines()) == 2
            assert store.close() == 0
        finally:
            assert other.close() == 0
    finally:
        m.stop()


def sglang_store(master):
    from mooncake.store import MooncakeDistributedStore

    store = MooncakeDistributedStore()
    ret, _ = setup_like_sglang(store, master, {})
    assert ret == 0
    return store
