"""``mooncake_master``: Mooncake's master command line, running ``moongate master``.

SGLang's and Mooncake's docs start the store with ``mooncake_master --port 50051 ...``. This
console script takes Mooncake's flags (gflags syntax: ``--flag=value``, ``--flag value``,
``-flag``, ``--flag`` / ``--noflag`` for booleans), says how each maps onto ``moongate
master``, and replaces itself with that process. The ``moongate`` binary is
``$MOONGATE_BIN`` or the first ``moongate`` on ``PATH``.

``FlagError`` (re-exported from ``moongate._gflags``) is what ``translate`` raises.

Three kinds of flags:

- mapped: the RPC port and address, Mooncake's HTTP service (``--metrics_port``, served by
  ``--mooncake-http-port``), leases, soft pins, eviction, client TTL, put timeouts, HA on
  etcd;
- accepted without effect, each with the reason (``IGNORED``): tuning of Mooncake's own RPC
  server and allocator that Moongate does not have;
- refused, with the reason (``REFUSED``): features Moongate's master does not have, so a
  command line that needs them fails at start instead of running without them.

``--print`` prints the ``moongate master`` command line instead of running it.
"""

import re
import sys

from moongate._gflags import FlagError, boolean, parse_flags, run, truthy

# Mooncake's flag -> (kind, Moongate flag, converter). Kinds: "int", "float", "bool",
# "str", "ms" (duration: raw milliseconds or a number with ms/s/m/h), "sec" (seconds).
MAPPED = {
    "port": ("int", "--port"),
    "rpc_port": ("int", "--port"),
    "rpc_address": ("str", "--host"),
    "metrics_port": ("int", "--mooncake-http-port"),
    "metrics_host": ("str", "--mooncake-http-host"),
    "default_kv_lease_ttl": ("ms", "--master-lease-ttl-ms"),
    "default_kv_soft_pin_ttl": ("ms", "--master-soft-pin-ttl-ms"),
    "allow_evict_soft_pinned_objects": ("bool", "--master-allow-evict-soft-pinned"),
    "eviction_ratio": ("float", "--master-eviction-ratio"),
    "eviction_high_watermark_ratio": ("float", "--master-eviction-high-watermark"),
    "client_ttl": ("sec", "--master-client-ttl-ms"),
    "put_start_discard_timeout_sec": ("sec", "--master-put-start-discard-timeout-ms"),
    "put_start_release_timeout_sec": ("sec", "--master-put-start-release-timeout-ms"),
    "enable_ha": ("bool", "--ha"),
    "etcd_endpoints": ("str", "--etcd-endpoints"),
    "ha_backend_connstring": ("str", "--etcd-endpoints"),
    "cluster_id": ("str", "--cluster-id"),
    "offload_on_evict": ("bool", "--master-disk-offload-on-evict"),
    "promotion_admission_threshold": ("int", "--master-disk-promote-after"),
    "kv_events_queue_capacity": ("int", "--master-events-buffer"),
}

# KV events: published on the bind endpoint when enabled (`translate` pairs the two).
KV_EVENTS = ("enable_kv_events", "kv_events_bind_endpoint")

# Mooncake's defaults for the mapped flags where they differ from Moongate's: a drop-in
# behaves as ``mooncake_master`` does when a flag is left out.
MOONCAKE_DEFAULTS = {
    "port": "50051",
    "metrics_port": "9003",
    "cluster_id": "mooncake_cluster",
}

IGNORED = {
    "enable_metric_reporting": "Moongate exports its metrics at /metrics and logs no periodic report",
    "max_threads": "the master runs on a tokio runtime (--worker-threads)",
    "rpc_thread_num": "the master runs on a tokio runtime (--worker-threads)",
    "rpc_conn_timeout_seconds": "idle connections close after --client-header-timeout-secs",
    "rpc_enable_tcp_no_delay": "Moongate always sets TCP_NODELAY",
    "rpc_interface": "give the address with --rpc_address",
    "memory_allocator": "Moongate's master has one allocator (offset-based)",
    "allocation_strategy": "Moongate places replicas by its own rule (free space, preferred segments)",
    "pod_name": "no Kubernetes labels are set by the master",
    "pod_namespace": "no Kubernetes labels are set by the master",
    "enable_metadata_cleanup_on_timeout": "segments of a client past its TTL are dropped anyway",
    "global_file_segment_size": "Moongate has no file-system segments (--root_fs_dir is refused)",
    "max_kv_soft_pin_ttl": "a put's soft pin lasts --default_kv_soft_pin_ttl",
    "enable_disk_eviction": (
        "each owner's disk tier drops its least recently used records past its capacity"
    ),
    "enable_offload": (
        "the disk tier is each client's (setup(..., enable_ssd_offload=True) or "
        "`moongate store --disk-path`); the master serves it whenever a segment has one"
    ),
    "promotion_on_hit": (
        "a value on disk is read back into memory when another client reads it, and when "
        "its owner has read it --promotion_admission_threshold times (0: never)"
    ),
    "promotion_queue_limit": (
        "promotions wait while the owner has 64 disk tasks queued"
    ),
    "promotion_max_per_heartbeat": (
        "owners take their disk tasks (16 at once) with their own long poll, not the heartbeat"
    ),
    "kv_events_backend_id": "a subscriber knows which master it subscribed to",
    "kv_events_model_name": "not emitted on events (as Mooncake's, deprecated)",
    "kv_events_tenant_id": "Moongate's master has no tenants",
    "kv_events_additional_salt": "not emitted on events (as Mooncake's, deprecated)",
    "kv_events_lora_name": "not emitted on events (as Mooncake's, deprecated)",
    "kv_events_block_size": "not emitted on events (as Mooncake's, deprecated)",
    "kv_events_dp_rank": "not emitted on events (as Mooncake's, deprecated)",
    "kv_events_emit_legacy_compat": (
        "events are SGLang's own format (BlockStored, BlockRemoved), always"
    ),
    "kv_events_emit_object_key": (
        "events name each page by its block hash, in SGLang's format, not by object key"
    ),
}

REFUSED = {
    "config_path": "give the settings as flags, or use `moongate master --config FILE`",
    "offload_force_evict": (
        "Moongate writes values to disk at completion or at eviction, not by force"
    ),
    "enable_cxl": "Moongate has no CXL segments",
    "enable_multi_tenants": "Moongate's master has no tenants",
    "enable_snapshot": "Moongate's master persists through HA on etcd (--enable_ha), not snapshots",
    "enable_snapshot_restore": "Moongate's master persists through HA on etcd, not snapshots",
    "enable_oplog": "Moongate's HA journal is always on with --enable_ha",
    "enable_http_metadata_server": (
        "Moongate's master serves the HTTP metadata store at /metadata on its own port: "
        "point MOONCAKE_TE_META_DATA_SERVER at http://HOST:PORT/metadata"
    ),
}
# Flags whose value is refused only when it asks for something Moongate lacks.
REFUSED_UNLESS = {
    "dynamic_replication_mode": ("off", "Moongate's master has no dynamic replication"),
    "ha_backend_type": ("etcd", "etcd is Moongate's one HA backend"),
    "root_fs_dir": ("", "Moongate has no file-system segments yet"),
}


def _duration_ms(name, value):
    m = re.fullmatch(r"\s*(\d+)\s*(ms|s|m|h)?\s*", value)
    if not m:
        raise FlagError(f"--{name}: {value!r} is not milliseconds or a duration (ms, s, m, h)")
    return int(m.group(1)) * {None: 1, "ms": 1, "s": 1000, "m": 60000, "h": 3600000}[m.group(2)]


def _number(name, value, kind):
    try:
        return int(value) if kind in ("int", "sec") else float(value)
    except ValueError:
        raise FlagError(f"--{name}: {value!r} is not a number") from None


def _kv_events(flags):
    """``--master-kv-events-endpoint`` for ``--enable_kv_events`` with its bind endpoint."""
    if not boolean("enable_kv_events", flags.get("enable_kv_events", "false")):
        return []
    endpoint = flags.get("kv_events_bind_endpoint", "").strip()
    if not endpoint:
        raise FlagError("--enable_kv_events needs --kv_events_bind_endpoint")
    host = endpoint.removeprefix("tcp://").rpartition(":")[0].strip("[]")
    if not endpoint.startswith("tcp://") or host not in ("127.0.0.1", "::1", "localhost"):
        raise FlagError(
            f"--kv_events_bind_endpoint={endpoint}: Moongate publishes KV events on loopback "
            "only (ZMQ carries no authentication here); routers on other hosts follow "
            "GET /api/v1/events with the store key")
    return ["--master-kv-events-endpoint", endpoint]


def parse(argv):
    """Mooncake's flags in ``argv`` as {name: value string}, gflags' syntax."""
    known = set(MAPPED) | set(IGNORED) | set(REFUSED) | set(REFUSED_UNLESS) | set(KV_EVENTS)
    bools = {n for n, (k, _) in MAPPED.items() if k == "bool"} | {
        n for n in set(REFUSED) | set(IGNORED) | set(KV_EVENTS)
        if n.startswith(("enable_", "allow_", "offload_", "promotion_", "rpc_enable",
                         "kv_events_emit_"))
    }
    return parse_flags(argv, known, bools)


def translate(argv):
    """The ``moongate master`` arguments and the notes (one per flag without effect) for
    Mooncake's command line ``argv``; raises FlagError for what Moongate cannot do."""
    flags = parse(argv)
    for name, value in flags.items():
        if name in REFUSED and truthy(name, value):
            raise FlagError(f"--{name}: {REFUSED[name]}")
        if name in REFUSED_UNLESS:
            allowed, why = REFUSED_UNLESS[name]
            if value.strip() not in (allowed, ""):
                raise FlagError(f"--{name}={value}: {why}")
    if flags.get("rpc_port", "0") in ("0", ""):
        flags.pop("rpc_port", None)
    else:
        flags.pop("port", None)
    args, notes = [], []
    for name in sorted(set(MOONCAKE_DEFAULTS) | set(flags)):
        if name in IGNORED:
            notes.append(f"--{name} has no effect on Moongate: {IGNORED[name]}")
            continue
        if name not in MAPPED:
            continue
        if name == "port" and "rpc_port" in flags:
            continue
        kind, target = MAPPED[name]
        value = flags.get(name, MOONCAKE_DEFAULTS.get(name))
        if kind == "bool":
            on = boolean(name, value)
            if target == "--ha":
                args += [target] if on else []
            else:
                args += [target, "true" if on else "false"]
        elif kind == "ms":
            args += [target, str(_duration_ms(name, value))]
        elif kind == "sec":
            args += [target, str(_number(name, value, kind) * 1000)]
        elif kind in ("int", "float"):
            args += [target, str(_number(name, value, kind))]
        elif target == "--etcd-endpoints":
            urls = [e if "://" in e else f"http://{e}" for e in re.split(r"[;,]", value) if e]
            args += [target, ",".join(urls)]
        else:
            args += [target, value]
    args += _kv_events(flags)
    if "--ha" in args and "--etcd-endpoints" not in args:
        raise FlagError("--enable_ha needs --etcd_endpoints (Moongate's HA runs on etcd)")
    return args, notes


def main(argv=None):
    return run("mooncake_master", __doc__, "master", translate, argv)


if __name__ == "__main__":
    sys.exit(main())
