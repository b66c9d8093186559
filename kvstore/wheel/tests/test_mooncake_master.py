"""The wheel's console scripts for Mooncake's command lines: `mooncake_master` (Mooncake's
flags as its docs and SGLang's give them, mapped onto `moongate master`, refused where
Moongate lacks the feature, and a real master started from them that a store and SGLang's
server check use) and `transfer_engine_bench` (a target and an initiator)."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import Proc, binary, new_store
from moongate import mooncake_master as mm


def test_flags_map_onto_moongate_master():
    args, notes = mm.translate([])
    # Mooncake's defaults where a flag is left out: the RPC port, the HTTP service.
    assert args == ["--cluster-id", "mooncake_cluster", "--mooncake-http-port", "9003",
                    "--port", "50051"]
    assert notes == []
    args, notes = mm.translate([
        "--port=50151", "-metrics_port", "9103", "--rpc_address", "127.0.0.1",
        "--default_kv_lease_ttl=5s", "--noallow_evict_soft_pinned_objects", "--enable_ha",
        "--etcd_endpoints", "h1:2379;h2:2379", "--client_ttl=20", "--rpc_thread_num=4",
        "--eviction_high_watermark_ratio=0.95",
    ])
    assert "--ha" in args
    valued = [a for a in args if a != "--ha"]
    pairs = dict(zip(valued[::2], valued[1::2]))
    assert pairs["--port"] == "50151" and pairs["--host"] == "127.0.0.1"
    assert pairs["--mooncake-http-port"] == "9103"
    assert pairs["--master-lease-ttl-ms"] == "5000"
    assert pairs["--master-allow-evict-soft-pinned"] == "false"
    assert pairs["--master-client-ttl-ms"] == "20000"
    assert pairs["--master-eviction-high-watermark"] == "0.95"
    assert pairs["--etcd-endpoints"] == "http://h1:2379,http://h2:2379"
    assert notes == ["--rpc_thread_num has no effect on Moongate: the master runs on a "
                     "tokio runtime (--worker-threads)"]
    # rpc_port wins over port, as in Mooncake; 0 means "use port".
    assert ("--port", "7000") in zip(*[iter(mm.translate(["--rpc_port=7000", "--port=1"])[0])] * 2)
    assert ("--port", "1") in zip(*[iter(mm.translate(["--rpc_port=0", "--port=1"])[0])] * 2)
    # Features left at their "off" values are fine.
    mm.translate(["--enable_offload=false", "--dynamic_replication_mode=off", "--config_path="])
    # The disk tier: the master's half of Mooncake's offload flags.
    args, notes = mm.translate(["--enable_offload", "--offload_on_evict", "--promotion_on_hit",
                                "--promotion_admission_threshold=3"])
    assert ("--master-disk-offload-on-evict", "true") in zip(*[iter(args)] * 2)
    assert ("--master-disk-promote-after", "3") in zip(*[iter(args)] * 2)
    assert any(n.startswith("--enable_offload has no effect") for n in notes), notes
    # KV events: published on a loopback endpoint.
    args, notes = mm.translate(["--enable_kv_events", "--kv_events_bind_endpoint",
                                "tcp://127.0.0.1:5557", "--kv_events_backend_id=pool-a",
                                "--kv_events_queue_capacity=1024"])
    assert ("--master-kv-events-endpoint", "tcp://127.0.0.1:5557") in zip(*[iter(args)] * 2)
    assert ("--master-events-buffer", "1024") in zip(*[iter(args)] * 2)
    assert any(n.startswith("--kv_events_backend_id has no effect") for n in notes), notes
    assert "--master-kv-events-endpoint" not in mm.translate(
        ["--kv_events_bind_endpoint=tcp://127.0.0.1:1"])[0]


@pytest.mark.parametrize("argv,why", [
    (["--offload_force_evict"], "not by force"),
    (["--enable_http_metadata_server=true"], "/metadata on its own port"),
    (["--root_fs_dir=/mnt/3fs"], "no file-system segments"),
    (["--dynamic_replication_mode=enforce"], "no dynamic replication"),
    (["--ha_backend_type=redis"], "etcd is Moongate's one HA backend"),
    (["--enable_ha"], "needs --etcd_endpoints"),
    (["--enable_kv_events"], "needs --kv_events_bind_endpoint"),
    (["--enable_kv_events", "--kv_events_bind_endpoint=tcp://0.0.0.0:5557"], "loopback only"),
    (["--bogus=1"], "unknown command line flag 'bogus'"),
    (["--default_kv_lease_ttl=5d"], "not milliseconds or a duration"),
    (["--client_ttl=ten"], "not a number"),
    (["--port"], "missing its value"),
    (["50051"], "flags only"),
])
def test_what_moongate_cannot_do_is_refused_at_start(argv, why):
    with pytest.raises(mm.FlagError, match=why):
        mm.translate(argv)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def script():
    path = Path(sys.executable).parent / "mooncake_master"
    assert path.exists(), f"{path}: the wheel installs the console script"
    return path


def test_refusals_exit_1_with_the_reason():
    r = subprocess.run([script(), "--enable_cxl"], capture_output=True, text=True,
                       env={"MOONGATE_BIN": str(binary("MOONGATE_BIN", "moongate"))})
    assert r.returncode == 1
    assert "--enable_cxl: Moongate has no CXL segments" in r.stderr
    r = subprocess.run([script(), "--port=1"], capture_output=True, text=True,
                       env={"PATH": "/nonexistent"})
    assert r.returncode == 1 and "moongate binary was not found" in r.stderr


def test_a_master_started_the_way_mooncake_docs_start_it():
    from test_sglang_hicache import sglang_check_server, warmup

    rpc, http = free_port(), free_port()
    p = Proc([script(), f"--port={rpc}", "--rpc_address=127.0.0.1", "--metrics_port", str(http),
              "--metrics_host=127.0.0.1", "--default_kv_lease_ttl=300ms",
              "--enable_metric_reporting=true"],
             r"moongate master listening addr=(\S+)",
             env={"MOONGATE_BIN": str(binary("MOONGATE_BIN", "moongate"))})
    try:
        assert p.match.group(1) == f"127.0.0.1:{rpc}"
        assert "--enable_metric_reporting has no effect on Moongate" in p.text()
        p.addr = f"127.0.0.1:{rpc}"
        assert sglang_check_server(p.addr, http, 0.2) is None
        store = new_store(p)
        try:
            assert sglang_check_server(p.addr, http, 5) is not None
            warmup(store)
        finally:
            assert store.close() == 0
    finally:
        p.stop()


def test_transfer_engine_bench_runs_mooncakes_command_lines():
    from moongate import transfer_engine_bench as teb

    args, notes = teb.translate(["--segment_id=h:1", "--protocol=tcp", "--device_name=mlx5_0"])
    pairs = dict(zip(args[::2], args[1::2]))
    assert pairs == {"--mode": "initiator", "--metadata": "p2p", "--protocol": "tcp",
                     "--listen": "0.0.0.0:0", "--buffer-size": "1073741824", "--threads": "12",
                     "--segment": "h:1", "--op": "read", "--block-size": "65536",
                     "--batch-size": "128", "--duration": "10"}
    assert notes == ["--device_name has no effect on Moongate: RDMA devices are found by the "
                     "transfer engine"]
    for argv, why in [(["--segment_id=h:1", "--metadata_server=10.0.0.1:2379"], "etcd"),
                      (["--segment_id=h:1", "--protocol=nvlink"], "tcp and rdma"),
                      (["--segment_id=h:1", "--backend=tent"], "one transfer engine"),
                      ([], "--segment_id is required"),
                      (["--segment_id=h:1", "--batch_size=0"], "positive")]:
        with pytest.raises(mm.FlagError, match=why):
            teb.translate(argv)

    script_dir = Path(sys.executable).parent
    env = {"TRANSFER_BENCH_BIN": str(binary("TRANSFER_BENCH_BIN", "transfer-bench")),
           **{k: v for k, v in os.environ.items() if k.startswith("MOONGATE_")}}
    port = free_port()
    target = Proc([script_dir / "transfer_engine_bench", "--mode=target", "--protocol=tcp",
                   f"--local_server_name=127.0.0.1:{port}", "--buffer_size=4194304"],
                  r"ready: segment (\S+)", env=env)
    try:
        assert target.match.group(1) == f"127.0.0.1:{port}"
        r = subprocess.run([script_dir / "transfer_engine_bench", f"--segment_id=127.0.0.1:{port}",
                            "--protocol=tcp", "--buffer_size=4194304", "--duration=1",
                            "--operation=write", "--threads=1"],
                           capture_output=True, text=True, env={**os.environ, **env}, timeout=60)
        assert r.returncode == 0, r.stderr
        assert "verified: 4194304 bytes match" in r.stdout, r.stdout
    finally:
        target.stop()


def test_mooncakes_cli_modules_run_the_same_scripts():
    for module, want in [("mooncake.cli", "master"), ("mooncake.cli_client", "store"),
                         ("mooncake.cli_bench", "--segment")]:
        argv = {"mooncake.cli": ["--port=1"],
                "mooncake.cli_client": ["--master_server_address=m:1"],
                "mooncake.cli_bench": ["--segment_id=h:1"]}[module]
        r = subprocess.run([sys.executable, "-m", module, "--print", *argv], capture_output=True,
                           text=True, env={**os.environ, "MOONGATE_BIN": "/bin/true",
                                           "TRANSFER_BENCH_BIN": "/bin/true"})
        assert r.returncode == 0, r.stderr
        assert want in r.stdout.split(), r.stdout
