"""SGLang's standalone storage (`MOONCAKE_STANDALONE_STORAGE=1`) the way it runs: a local
store process started with Mooncake's `mooncake_client` command line, SGLang's host KV pool
allocated with `MooncakeHostMemAllocator`, `setup_dummy` beside the store process, then
HiCache's calls; the cache outlives its clients, and a client outlives a store restart."""

import ctypes
import socket
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import MiB, Proc, binary, wait_until

PAGE = 8192


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def store_process(master, port):
    """`mooncake_client`, as Mooncake's docs start it, on 127.0.0.1:`port`."""
    script = Path(sys.executable).parent / "mooncake_client"
    return Proc([script, f"--master_server_address={master.addr}", "--host=127.0.0.1",
                 f"--port={port}", "--global_segment_size=64MB", "--protocol=tcp"],
                r"moongate store ready: segment (\S+)",
                env={"MOONGATE_BIN": str(binary("MOONGATE_BIN", "moongate"))})


def pool(allocator, pages):
    """SGLang's MooncakeHostTensorAllocator: the allocator's memory as an array."""
    size = pages * PAGE
    ptr = allocator.alloc(size)
    assert ptr != 0 and ptr % 4096 == 0
    return ptr, np.frombuffer((ctypes.c_byte * size).from_address(ptr), dtype=np.uint8)


def dummy(port, pool_ptr, pool_size):
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    assert s.setup_dummy(pool_size, 16 * MiB, f"127.0.0.1:{port}") == 0
    # MooncakeStore.warmup, then register_mem_pool_host.
    assert s.put("warmup", bytes(4096)) == 0
    assert s.is_exist("warmup") == 1 and s.get("warmup") == bytes(4096)
    assert s.register_buffer(pool_ptr, pool_size) == 0
    return s


def test_the_cache_lives_in_the_store_process_and_outlives_its_clients(master, store):
    from mooncake.store import MooncakeHostMemAllocator

    # `store` mounts a second segment: the pages must still go to the store process's.
    port = free_port()
    node = store_process(master, port)
    try:
        segment = node.match.group(1)
        alloc = MooncakeHostMemAllocator()
        ptr, arr = pool(alloc, 32)
        arr[:] = np.random.default_rng(5).integers(0, 256, arr.size, dtype=np.uint8)
        s = dummy(port, ptr, arr.nbytes)
        keys = [f"sa-page-{i}" for i in range(16)]
        assert s.batch_put_from(keys, [ptr + i * PAGE for i in range(16)], [PAGE] * 16) == [0] * 16
        # The pages sit in the store process's segment, not in this client.
        ends = {r.get_memory_descriptor().buffer_descriptor.transport_endpoint
                for k in keys for r in s.get_replica_desc(k)}
        assert ends == {segment.split("#")[0]}
        assert s.close() == 0
        # A new client (SGLang restarted) finds them, byte for byte, into its own pool.
        ptr2, arr2 = pool(alloc, 32)
        s2 = dummy(port, ptr2, arr2.nbytes)
        got = s2.batch_get_into(keys, [ptr2 + i * PAGE for i in range(16)], [PAGE] * 16)
        assert got == [PAGE] * 16
        assert np.array_equal(arr2[:16 * PAGE], arr[:16 * PAGE])
        assert s2.unregister_buffer(ptr2) == 0
        assert alloc.free(ptr2) == 0 and alloc.free(ptr2) == -1
        assert s2.close() == 0
    finally:
        node.stop()


def test_a_client_outlives_a_store_restart(master):
    from mooncake.store import MooncakeHostMemAllocator

    port = free_port()
    node = store_process(master, port)
    alloc = MooncakeHostMemAllocator()
    ptr, arr = pool(alloc, 4)
    arr[:] = 7
    s = dummy(port, ptr, arr.nbytes)
    try:
        assert s.put_from("sr-k", ptr, PAGE) == 0
        node.stop()
        # The store process is gone and its pages with it: a clear miss, not a hang.
        wait_until(lambda: s.get_into("sr-k", ptr + PAGE, PAGE) < 0, 15, "the pages to go")
        node = store_process(master, port)
        # Back: puts land in the new process's segment again.
        wait_until(lambda: s.put_from("sr-k2", ptr, PAGE) == 0, 15, "puts to work again")
        assert s.get_into("sr-k2", ptr + PAGE, PAGE) == PAGE
    finally:
        assert s.close() == 0
        node.stop()


def test_the_allocator_and_setup_dummy_refuse_what_they_cannot_do():
    from mooncake.store import MooncakeDistributedStore, MooncakeHostMemAllocator

    a = MooncakeHostMemAllocator()
    assert a.alloc(1 << 62) == 0
    assert a.free(12345) == -1
    # Memory from a temporary allocator stays until freed (SGLang-style code may drop it).
    ptr = MooncakeHostMemAllocator().alloc(1 << 20)
    import gc
    gc.collect()
    ctypes.memset(ptr, 1, 1 << 20)
    assert ctypes.string_at(ptr + (1 << 20) - 1, 1) == b"\x01"
    assert a.free(ptr) == 0
    s = MooncakeDistributedStore()
    assert s.setup_dummy(0, 16 * MiB, "127.0.0.1:9") == -600
    assert s.setup_dummy(1 << 20, 16 * MiB, "127.0.0.1:9") == -900  # nothing listens
    with pytest.raises(TypeError):
        s.setup_dummy(1 << 20, 16 * MiB)


def test_mooncake_client_flags_map_onto_moongate_store():
    from moongate import mooncake_client as mc
    from moongate._gflags import FlagError

    args, notes = mc.translate(["--master_server_address=m:50051", "--threads=4",
                                "--local_buffer_size=16MB", "--device_names=mlx5_0"])
    pairs = dict(zip(args[::2], args[1::2]))
    assert pairs == {"--master": "http://m:50051", "--segment-size": str(4 << 30),
                     "--http-listen": "0.0.0.0:50052", "--metadata": "p2p",
                     "--protocol": "auto", "--local-buffer-size": str(16 << 20)}
    assert [n.split(" ")[0] for n in notes] == ["--threads", "--device_names"]
    # --enable_offload: a disk tier where Mooncake's FileStorage writes, written through.
    env = {"MOONCAKE_OFFLOAD_FILE_STORAGE_PATH": "/nvme/mc",
           "MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES": "1073741824"}
    assert mc.offload_args(env) == ["--disk-path", "/nvme/mc", "--disk-capacity", "1073741824",
                                    "--disk-write-policy", "write-through"]
    assert mc.offload_args({})[:2] == ["--disk-path", "/data/file_storage"]
    with pytest.raises(FlagError, match="absolute path"):
        mc.offload_args({"MOONCAKE_OFFLOAD_FILE_STORAGE_PATH": "rel"})
    for argv, why in [(["--master_server_address=m:1", "--tenant_id=t"], "one tenant"),
                      ([], "master_server_address is required"),
                      (["--master_server_address=m:1", "--protocol=nvlink"], "tcp and rdma"),
                      (["--master_server_address=m:1", "--global_segment_size=lots"], "not a size"),
                      (["--master_server_address=m:1", "--metadata_server=etcd://e:2379"], "P2PHANDSHAKE")]:
        with pytest.raises(FlagError, match=why):
            mc.translate(argv)


def test_the_allocator_functions_c_callers_get():
    from mooncake.store import get_alloc_func_addr, get_free_func_addr

    alloc = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t)(get_alloc_func_addr())
    free = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(get_free_func_addr())
    ptr = alloc(1 << 20)
    assert ptr and ptr % 4096 == 0
    ctypes.memset(ptr, 3, 1 << 20)
    assert ctypes.string_at(ptr + 12345, 1) == b"\x03"
    free(ptr)
    free(12345)  # not one of its own: left alone
    assert alloc(1 << 62) is None  # too large: NULL
