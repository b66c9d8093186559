"""Mooncake's SSD offload through its own API: ``setup(..., enable_ssd_offload=True,
ssd_offload_path=...)`` puts a disk tier under the client's segment. The shape the issue
measured Mooncake 0.3.13 with: a writer with 64 MiB of DRAM puts 512 values of 1 MiB (each
put retried for up to 2 s); every put is accepted and reads back; after the writer's
SIGKILL a new client on the same directory reads them again. Both write policies: written
through (Mooncake's default) and offload on eviction (the master's ``--offload_on_evict``,
here ``--master-disk-offload-on-evict``)."""

import os
import signal
import time

import pytest

from conftest import Master, MiB, new_store, python_child, wait_until
from offload_writer import value

VALUES = 512


def read_all(store, keys, timeout):
    """How many of `keys` read back byte-exact, each waited for up to `timeout` seconds
    (a restarted owner reports its records with its first exchanges)."""
    good = 0
    for k in keys:
        deadline = time.monotonic() + timeout
        while True:
            got = store.get(k)
            if got or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        i = int(k.split("/")[1])
        if got:
            assert got == value(i), f"{k} came back different"
            good += 1
    return good


@pytest.mark.parametrize("policy", ["write-through", "offload-on-evict"])
def test_the_issue_shape_keeps_every_value_and_survives_the_writers_sigkill(tmp_path, policy):
    extra = ["--master-disk-offload-on-evict", "true"] if policy == "offload-on-evict" else []
    # A killed writer's segment goes within three seconds (three of its heartbeats: with
    # one second, a heartbeat a busy machine delayed expired the live writer, which then
    # remounted and had puts refused for the write window).
    master = Master("--master-client-ttl-ms", "3000", *extra)
    t0 = time.monotonic()
    path = str(tmp_path / "ssd")
    try:
        writer = python_child("offload_writer.py", master.addr, path, 64, VALUES)
        line = writer.stdout.readline()
        assert line.startswith("accepted"), line + writer.stderr.read()
        assert int(line.split()[1]) == VALUES, line
        print(f"puts {time.monotonic() - t0:.1f}s")
        keys = [f"ssd/{i}" for i in range(VALUES)]
        reader = new_store(master, segment=0)
        # Described as they lie, without reading anything back: the first values were
        # evicted to the writer's disk (LOCAL_DISK only), the last are in its memory too
        # when written through.
        descs = reader.batch_get_replica_desc(keys)
        kinds = [sorted("disk" if r.is_local_disk_replica() else "memory" for r in descs[k])
                 for k in keys]
        assert kinds[0] == ["disk"], kinds[0]
        assert "memory" in kinds[-1], kinds[-1]
        if policy == "write-through":
            # Its copy on disk is written soon after the put.
            wait_until(lambda: any(r.is_local_disk_replica()
                                   for r in reader.get_replica_desc(keys[-1])),
                       5, "the last value's copy on disk")
        else:
            assert kinds[-1] == ["memory"]
        d = descs[keys[0]][0]
        assert d.get_disk_descriptor().object_size == MiB
        assert reader.batch_get_replica_desc(keys[:1])[keys[0]][0].is_local_disk_replica()
        assert read_all(reader, keys, timeout=5) == VALUES
        print(f"gets {time.monotonic() - t0:.1f}s")
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        records = sum(1 for f in os.listdir(path) if f.endswith(".rec"))
        # A new client on the writer's directory: its records are served again.
        again = new_store(master, segment=64 * MiB, ssd_offload_path=path)
        # (a read may first wait out a load the dead writer was asked for)
        got = read_all(reader, keys, timeout=10)
        print(f"{policy}: {records} records on disk at the SIGKILL, {got}/{VALUES} read after it")
        if policy == "write-through":
            assert got >= VALUES * 0.999, f"{got}/{VALUES}"
        else:
            # What was only in the killed writer's memory is gone with it.
            assert got >= records, f"{got} read of {records} records"
        assert again.close() == 0 and reader.close() == 0
    finally:
        master.stop()


def test_setup_refuses_a_relative_offload_path(master):
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "tcp", "", master.addr,
                 None, True, "relative/dir")
    assert rc == -600
    assert s.get_offload_rpc_read_count() == 0


def test_unmount_local_disk_segment_stops_the_tier_and_loses_only_the_disk_values(master, tmp_path):
    s = new_store(master, segment=8 * MiB, ssd_offload_path=str(tmp_path / "ssd"))
    keys = [f"unmount/{i}" for i in range(24)]
    for i, k in enumerate(keys):
        wait_until(lambda: s.put(k, value(i)) == 0, 10, f"put {k}")

    def on_disk_only():
        descs = s.batch_get_replica_desc(keys)
        return [k for k in keys
                if descs.get(k) and all(r.is_local_disk_replica() for r in descs[k])]

    wait_until(lambda: len(on_disk_only()) >= 4, 20, "values on disk only")
    cold = on_disk_only()
    # Read from the own disk before: the whole value.
    assert s.get(cold[0]) == value(keys.index(cold[0]))
    assert s.unmount_local_disk_segment(0) == 0
    # What lived only on the disk is gone; what is in memory still reads.
    for k in cold:
        assert s.is_exist(k) == 0 and s.get(k) == b""
    warm = [k for k in keys if k not in cold and s.is_exist(k) == 1]
    assert warm, "nothing left in memory"
    assert s.get(warm[0]) == value(keys.index(warm[0]))
    # Nothing more goes to the disk; a second call does nothing.
    descs = s.batch_get_replica_desc(warm)
    assert not any(r.is_local_disk_replica() for k in warm for r in descs.get(k, []))
    assert s.unmount_local_disk_segment(grace_period_seconds=0) == 0
    assert s.close() == 0
