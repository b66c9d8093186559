"""Replica descriptions (`get_replica_desc`, `batch_get_replica_desc`), Mooncake's enums
and `ReplicateConfig` fields, and `mooncake.mooncake_config`, as their users call them."""

import json

import pytest

from conftest import MiB, new_store


def test_replicas_are_described_as_mooncake_describes_them(store):
    from mooncake.store import COMPLETE, ReplicaStatus

    assert store.put("rd-k", b"x" * 1000) == 0
    d = store.get_replica_desc("rd-k")
    assert len(d) == 1
    r = d[0]
    assert r.status == ReplicaStatus.COMPLETE == COMPLETE
    assert (r.is_memory_replica(), r.is_disk_replica(), r.is_local_disk_replica()) == (True, False, False)
    b = r.get_memory_descriptor().buffer_descriptor
    assert b.size == 1000 and b.buffer_address > 0 and ":" in b.transport_endpoint
    assert repr(b) == (f"<Descriptor size=1000 buffer_address={b.buffer_address} "
                       f"transport_endpoint={b.transport_endpoint}>")
    with pytest.raises(RuntimeError, match="Expected DiskDescriptor"):
        r.get_disk_descriptor()
    assert store.get_replica_desc("rd-none") == []
    both = store.batch_get_replica_desc(["rd-k", "rd-none"])
    assert list(both) == ["rd-k"] and both["rd-k"][0].get_memory_descriptor().buffer_descriptor.size == 1000


def test_enums_and_config_fields_behave_as_mooncakes():
    from mooncake.store import KVCACHE, ObjectDataType, ReplicaStatus, ReplicateConfig

    assert (ReplicaStatus.FAILED.value, ReplicaStatus.FAILED.name) == (5, "FAILED")
    assert str(ObjectDataType.KVCACHE) == "ObjectDataType.KVCACHE"
    assert repr(ObjectDataType.OPTIMIZER_STATE) == "<ObjectDataType.OPTIMIZER_STATE: 7>"
    c = ReplicateConfig()
    assert c.group_ids is None and c.data_type == ObjectDataType.UNKNOWN
    c.group_ids = ["g"]
    c.group_ids = None
    c.data_type = KVCACHE
    assert c.data_type == ObjectDataType.KVCACHE
    with pytest.raises(TypeError):
        c.data_type = 3  # Mooncake takes the enum only


def test_mooncake_config_from_env_and_file(master, monkeypatch, tmp_path):
    from mooncake.mooncake_config import DEFAULT_GLOBAL_SEGMENT_SIZE, MooncakeConfig
    from mooncake.store import MooncakeDistributedStore

    for k in ("MOONCAKE_CONFIG_PATH", "MOONCAKE_MASTER", "MOONCAKE_GLOBAL_SEGMENT_SIZE"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(ValueError, match="MOONCAKE_MASTER"):
        MooncakeConfig.load_from_env()
    monkeypatch.setenv("MOONCAKE_MASTER", master.addr)
    monkeypatch.setenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", "32mb")
    monkeypatch.setenv("MOONCAKE_LOCAL_BUFFER_SIZE", "16MB")
    monkeypatch.setenv("MOONCAKE_PROTOCOL", "TCP")
    monkeypatch.setenv("MOONCAKE_LOCAL_HOSTNAME", "127.0.0.1")
    c = MooncakeConfig.load_from_env()
    assert (c.global_segment_size, c.local_buffer_size, c.protocol) == (32 * MiB, 16 * MiB, "tcp")
    assert (c.metadata_server, c.tenant_id, c.client_http_port) == ("P2PHANDSHAKE", "default", 9300)
    s = MooncakeDistributedStore()
    assert s.setup(c.local_hostname, c.metadata_server, c.global_segment_size,
                   c.local_buffer_size, c.protocol, c.device_name, c.master_server_address) == 0
    assert s.put("cfg-k", b"v") == 0 and s.get("cfg-k") == b"v"
    assert s.close() == 0

    monkeypatch.setenv("MOONCAKE_OFFLOAD_ENABLED", "maybe")
    with pytest.raises(ValueError, match="boolean"):
        MooncakeConfig.load_from_env()

    f = tmp_path / "mooncake.json"
    f.write_text(json.dumps({"local_hostname": "h", "metadata_server": "P2PHANDSHAKE",
                             "master_server_address": master.addr,
                             "enable_ssd_offload": "off"}))
    monkeypatch.setenv("MOONCAKE_CONFIG_PATH", str(f))
    c = MooncakeConfig.load_from_env()
    assert (c.global_segment_size, c.enable_ssd_offload, c.protocol) == (DEFAULT_GLOBAL_SEGMENT_SIZE, False, "tcp")
    f.write_text(json.dumps({"local_hostname": "h", "metadata_server": "P2PHANDSHAKE"}))
    with pytest.raises(ValueError, match="master_server_address"):
        MooncakeConfig.from_file(str(f))
    for bad in ({"global_segment_size": -1}, {"protocol": " "}, {"local_hostname": ""}):
        args = dict(local_hostname="h", metadata_server="m", global_segment_size=1,
                    local_buffer_size=1, protocol="tcp", device_name="",
                    master_server_address="a:1")
        args.update(bad)
        with pytest.raises(ValueError):
            MooncakeConfig(**args)


def test_bind_to_numa_node_runs_the_thread_on_the_node_s_cpus():
    import os
    import threading

    from mooncake.store import bind_to_numa_node

    seen = {}

    def work():
        before = os.sched_getaffinity(0)
        assert bind_to_numa_node(0) is None
        seen["node0"] = os.sched_getaffinity(0)
        assert bind_to_numa_node(4096) is None  # no such node: nothing changes
        seen["after_bad"] = os.sched_getaffinity(0)
        os.sched_setaffinity(0, before)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    with open("/sys/devices/system/node/node0/cpulist") as f:
        first = int(f.read().split(",")[0].split("-")[0])
    assert first in seen["node0"] and seen["after_bad"] == seen["node0"]


def test_a_client_clears_its_own_replicas(store, master):
    from mooncake.store import ReplicateConfig

    from conftest import wait_until

    other = new_store(master)
    try:
        c = ReplicateConfig()
        c.replica_num = 2
        assert store.put("rc-k", b"v" * 100, c) == 0
        assert other.batch_replica_clear(["rc-k"]) == []  # not its object
        ends = {r.get_memory_descriptor().buffer_descriptor.transport_endpoint
                for r in store.get_replica_desc("rc-k")}
        assert len(ends) == 2
        # This client's own segment, named as get_hostname() names it, once the read
        # lease of the description above has run out.
        wait_until(lambda: store.batch_replica_clear(["rc-k"], store.get_hostname()) == ["rc-k"],
                   5, "the lease to end")
        left = store.get_replica_desc("rc-k")
        assert len(left) == 1 and store.get("rc-k") == b"v" * 100
        wait_until(lambda: store.batch_replica_clear(["rc-k", "rc-none"]) == ["rc-k"], 5,
                   "the lease to end")
        assert store.is_exist("rc-k") == 0
    finally:
        assert other.close() == 0


def test_the_async_store_awaits_every_call(master):
    import asyncio

    from mooncake.async_store import MooncakeDistributedStoreAsync

    async def run():
        s = MooncakeDistributedStoreAsync()
        rc = await s.async_setup("127.0.0.1", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "tcp", "",
                                 master.addr)
        assert rc == 0
        keys = [f"async-{i}" for i in range(8)]
        assert await asyncio.gather(*(s.async_put(k, k.encode()) for k in keys)) == [0] * 8
        got = await asyncio.gather(*(s.async_get(k) for k in keys))
        assert got == [k.encode() for k in keys]
        assert await s.async_is_exist("async-0") == 1
        with pytest.raises(AttributeError):
            s.async_no_such_call
        with pytest.raises(AttributeError):
            s.no_such_attribute
        assert await s.async_close() == 0

    asyncio.run(run())
