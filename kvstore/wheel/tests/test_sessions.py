"""Get and put sessions the way their users call them: SGLang's layer-wise loader (one get
session per batch of pages, one ranged read per layer, then the end) on host buffers, the
layer-wise writer (a put session, one ranged write per layer, the end), and what a session
leaves behind when its lease runs out or its holder dies."""

import numpy as np
import pytest

from conftest import Master, new_store, python_child, remove_when_unleased, wait_until

INVALID_PARAMS, OBJECT_NOT_FOUND, LEASE_EXPIRED = -600, -704, -707
LAYERS, PAGE = 8, 1024  # per layer and page: k then v, PAGE bytes each


class Pool:
    """A layer-major KV pool: for each layer, `pages` pages of k then v (SGLang's layout)."""

    def __init__(self, pages, fill=None):
        self.pages = pages
        self.buf = np.zeros(LAYERS * pages * 2 * PAGE, dtype=np.uint8)
        if fill is not None:
            self.buf[:] = np.random.default_rng(fill).integers(0, 256, self.buf.size, dtype=np.uint8)

    def ptr(self, layer, page, kv):
        return self.buf.ctypes.data + ((layer * self.pages + page) * 2 + kv) * PAGE

    def page_bytes(self, page):
        return b"".join(self.buf[(l * self.pages + page) * 2 * PAGE:
                                 (l * self.pages + page + 1) * 2 * PAGE].tobytes()
                        for l in range(LAYERS))


def layer_meta(pool, pages, layer):
    """One layer's ranges of each page's object (object = every layer's k, v in order)."""
    ptrs = [[pool.ptr(layer, p, 0), pool.ptr(layer, p, 1)] for p in pages]
    sizes = [[PAGE, PAGE] for _ in pages]
    offsets = [[layer * 2 * PAGE, layer * 2 * PAGE + PAGE] for _ in pages]
    return ptrs, sizes, offsets


@pytest.fixture
def pools(store):
    src, dst = Pool(16, fill=3), Pool(16)
    for p in (src, dst):
        assert store.register_buffer(p.buf.ctypes.data, p.buf.nbytes) == 0
    return src, dst


def test_layer_wise_write_then_layer_wise_load(store, pools):
    src, dst = pools
    keys = [f"lw-page-{i}" for i in range(16)]
    obj = LAYERS * 2 * PAGE
    assert store.batch_put_session_start(keys, [obj] * len(keys)) == [0] * len(keys)
    assert store.batch_is_exist(keys) == [0] * len(keys), "invisible until the end"
    for layer in range(LAYERS):
        ptrs, sizes, offsets = layer_meta(src, range(16), layer)
        assert store.batch_put_from_multi_buffer_ranges(keys, ptrs, sizes, offsets) == [2 * PAGE] * 16
    assert store.batch_put_session_end(keys) == [0] * len(keys)
    assert store.batch_is_exist(keys) == [1] * len(keys)
    for i, k in enumerate(keys):
        assert store.get(k) == src.page_bytes(i)

    # The loader: one session, one call per layer (pages land in other slots), the end.
    slots = list(range(15, -1, -1))
    assert store.batch_get_session_start(keys) == [0] * len(keys)
    for layer in range(LAYERS):
        ptrs, sizes, offsets = layer_meta(dst, slots, layer)
        expected = [sum(s) for s in sizes]
        assert store.batch_get_into_multi_buffer_ranges(keys, ptrs, sizes, offsets) == expected
    assert store.batch_get_session_end(keys) == 0
    for i, slot in enumerate(slots):
        assert dst.page_bytes(slot) == src.page_bytes(i)


def test_bad_calls_get_mooncakes_codes(store, pools):
    src, dst = pools
    obj = LAYERS * 2 * PAGE
    assert store.batch_put_session_start(["bc-a", "bc-a"], [obj, obj]) == [0, INVALID_PARAMS]
    assert store.batch_put_session_start(["bc-a"], [obj]) == [INVALID_PARAMS]
    ptrs, sizes, offsets = layer_meta(src, [0], LAYERS)  # one layer past the object's end
    assert store.batch_put_from_multi_buffer_ranges(["bc-a"], ptrs, sizes, offsets) == [INVALID_PARAMS]
    ptrs, sizes, offsets = layer_meta(src, [0], 0)
    assert store.batch_put_from_multi_buffer_ranges(["bc-none"], ptrs, sizes, offsets) == [INVALID_PARAMS]
    assert store.batch_put_from_multi_buffer_ranges(["bc-a"], ptrs, sizes, [[0]]) == [INVALID_PARAMS]
    assert store.batch_put_from_multi_buffer_ranges(["bc-a"], ptrs, sizes, []) == [INVALID_PARAMS]
    # Memory that was never registered.
    junk = np.zeros(PAGE, dtype=np.uint8)
    assert store.batch_put_from_multi_buffer_ranges(
        ["bc-a"], [[junk.ctypes.data]], [[PAGE]], [[0]]) == [INVALID_PARAMS]
    assert store.batch_put_session_revoke(["bc-a"]) == [0]
    assert store.is_exist("bc-a") == 0
    assert store.batch_put_session_end(["bc-a"]) == [INVALID_PARAMS]
    # The key is free again after a revoke.
    assert store.put("bc-a", b"x") == 0

    assert store.batch_get_session_start(["bc-missing", "bc-a"]) == [OBJECT_NOT_FOUND, 0]
    ptrs, sizes, offsets = layer_meta(dst, [0, 1], 0)
    got = store.batch_get_into_multi_buffer_ranges(["bc-missing", "bc-a"], ptrs, sizes, offsets)
    assert got == [INVALID_PARAMS, INVALID_PARAMS]  # no session; ranges past a 1-byte object
    assert store.batch_get_into_multi_buffer_ranges(
        ["bc-a"], [[dst.ptr(0, 0, 0)]], [[1]], [[0]]) == [1]
    assert dst.buf[0] == ord("x")
    assert store.batch_get_session_end(["bc-a", "never-started"]) == 0


def test_sessions_of_a_store_not_set_up_answer_nothing():
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    assert s.batch_get_session_start(["k"]) == []
    assert s.batch_get_into_multi_buffer_ranges(["k"], [[1]], [[1]], [[0]]) == []
    assert s.batch_get_session_end(["k"]) == -1
    assert s.batch_put_session_start(["k"], [1]) == []
    assert s.batch_put_session_end(["k"]) == []


def test_an_expired_session_answers_lease_expired_and_starts_again(store, pools, master):
    src, dst = pools
    assert store.put_from("exp-k", src.ptr(0, 0, 0), 2 * PAGE) == 0
    assert store.batch_get_session_start(["exp-k"]) == [0]
    one = ([[dst.ptr(0, 0, 0)]], [[PAGE]], [[0]])
    assert store.batch_get_into_multi_buffer_ranges(["exp-k"], *one) == [PAGE]
    # The master's read lease is short in these tests (conftest): the session outlives it.
    wait_until(lambda: store.batch_get_into_multi_buffer_ranges(["exp-k"], *one) == [LEASE_EXPIRED],
               5, "the session's lease to run out")
    assert store.batch_get_into_multi_buffer_ranges(["exp-k"], *one) == [INVALID_PARAMS]
    assert store.batch_get_session_start(["exp-k"]) == [0]
    assert store.batch_get_into_multi_buffer_ranges(["exp-k"], *one) == [PAGE]
    assert store.batch_get_session_end(["exp-k"]) == 0
    remove_when_unleased(store, "exp-k")


def test_a_dead_holder_leaves_only_what_runs_out():
    # Short put timeouts: a dead writer's unfinished put is taken over within a second (the
    # write window, a tenth of the reservation TTL, must be shorter than the discard).
    m = Master("--master-put-start-discard-timeout-ms", "300",
               "--master-put-start-release-timeout-ms", "600",
               "--master-reservation-ttl-ms", "2000")
    try:
        s = new_store(m)
        assert s.put("held-by-dead", b"v" * 4096) == 0
        child = python_child("session_holder.py", m.addr, "written-by-dead", "held-by-dead")
        try:
            assert child.stdout.readline().strip() == "ready", child.stderr.read()
        finally:
            child.kill()
            child.wait()
        # Its put never became readable; once discarded the key can be put again (a put
        # of a key under way answers 0 without writing, as Mooncake's does: read it back).
        assert s.is_exist("written-by-dead") == 0
        wait_until(lambda: s.put("written-by-dead", b"mine") == 0
                   and s.get("written-by-dead") == b"mine", 10,
                   "the dead writer's put to be discarded")
        # Its get session held only a lease: the object can be removed once it runs out.
        remove_when_unleased(s, "held-by-dead")
        assert s.close() == 0
    finally:
        m.stop()
