"""``mooncake_client``: Mooncake's standalone store process, running ``moongate store``.

SGLang's standalone storage (``MOONCAKE_STANDALONE_STORAGE=1``, or
``standalone_storage: true`` with ``client_server_address``) needs a local store process
that holds the cache, so it outlives SGLang; Mooncake starts it with
``mooncake_client --master_server_address=... --port=50052``. This script takes those flags
and runs a Moongate storage node in its place, whose ``/health`` on ``--host:--port`` is
what the wheel's ``setup_dummy(..., server_address)`` reads (see ``moongate.store``).

- mapped: ``--master_server_address`` (``--master``), ``--global_segment_size``
  (``--segment-size``, Mooncake's "4 GB" form accepted), ``--local_buffer_size``,
  ``--host``/``--port`` (``--http-listen``, Mooncake's 0.0.0.0:50052 by default),
  ``--metadata_server`` (``P2PHANDSHAKE`` or Mooncake's HTTP metadata URL), ``--protocol``
  (``tcp`` and ``rdma`` both run ``auto``: shared memory with the clients on this host is
  what standalone storage is for, RDMA where a device is usable, TCP otherwise);
- accepted without effect, with the reason: ``--threads``, ``--device_names``,
  ``--enable_http_server``/``--http_port`` (the node's ``/health`` and ``/metrics`` are on
  ``--port``), ``--start_offload_rpc_server``;
- ``--enable_offload``: a disk tier (``--disk-path``) where Mooncake's FileStorage writes
  (``MOONCAKE_OFFLOAD_FILE_STORAGE_PATH``, bounded by
  ``MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES``), written through;
- refused with the reason: a ``--tenant_id`` other than ``default``.

``--print`` prints the ``moongate store`` command line instead of running it.
"""

import os
import re
import sys

from moongate._gflags import FlagError, parse_flags, run, truthy

IGNORED = {
    "threads": "the node runs on a tokio runtime",
    "device_names": "RDMA devices are found by the transfer engine",
    "enable_http_server": "the node's /health and /metrics are always on --port",
    "http_port": "the node's /health and /metrics are on --port",
    "start_offload_rpc_server": "readers reach the disk tier through the master, no RPC server",
}
VALUED = {"master_server_address", "global_segment_size", "local_buffer_size", "host", "port",
          "metadata_server", "protocol", "tenant_id", "threads", "device_names", "http_port"}
BOOLS = {"enable_offload", "enable_http_server", "start_offload_rpc_server"}
DEFAULTS = {"host": "0.0.0.0", "port": "50052", "global_segment_size": "4 GB",
            "metadata_server": "P2PHANDSHAKE", "protocol": "tcp"}


def size(name, value):
    """Mooncake's size text ("4 GB", "16MB", bytes) as ``moongate store`` takes it."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", value, re.IGNORECASE)
    if not m:
        raise FlagError(f"--{name}: {value!r} is not a size (bytes, or with KB, MB, GB, TB)")
    number, unit = m.groups()
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[unit.lower()]
    return str(int(float(number) * scale))


# Mooncake's FileStorageConfig defaults: the directory and the bound on offloaded bytes.
OFFLOAD_PATH = "/data/file_storage"
OFFLOAD_BYTES = 2 << 40


def offload_args(env):
    """``--enable_offload``: a disk tier where Mooncake's FileStorage would write
    (``MOONCAKE_OFFLOAD_FILE_STORAGE_PATH``), bounded as Mooncake bounds it
    (``MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES``), written through as Mooncake does unless
    the master says ``--offload_on_evict``."""
    path = env.get("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH") or OFFLOAD_PATH
    if not path.startswith("/"):
        raise FlagError(f"MOONCAKE_OFFLOAD_FILE_STORAGE_PATH={path!r} must be an absolute path")
    limit = env.get("MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES") or str(OFFLOAD_BYTES)
    if not limit.strip().isdigit():
        raise FlagError(f"MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES={limit!r} is not a byte count")
    return ["--disk-path", path, "--disk-capacity", limit.strip(),
            "--disk-write-policy", "write-through"]


def translate(argv):
    """The ``moongate store`` arguments and the notes for Mooncake's command line ``argv``;
    raises FlagError for what Moongate cannot do."""
    flags = {**DEFAULTS, **parse_flags(argv, VALUED | BOOLS, BOOLS)}
    if flags.get("tenant_id", "default") != "default":
        raise FlagError("--tenant_id: Moongate's store has one tenant, 'default'")
    master = flags.get("master_server_address")
    if not master:
        raise FlagError("--master_server_address is required (the master's host:port)")
    if flags["protocol"] not in ("tcp", "rdma"):
        raise FlagError(f"--protocol={flags['protocol']}: Moongate speaks tcp and rdma")
    meta = flags["metadata_server"]
    if meta == "P2PHANDSHAKE":
        meta = "p2p"
    elif not meta.startswith(("http://", "https://")):
        raise FlagError(f"--metadata_server={meta}: P2PHANDSHAKE or an http(s):// metadata URL")
    host = flags["host"]
    args = [
        "--master", master if "://" in master else f"http://{master}",
        "--segment-size", size("global_segment_size", flags["global_segment_size"]),
        "--http-listen", f"[{host}]:{flags['port']}" if ":" in host else f"{host}:{flags['port']}",
        "--metadata", meta,
        "--protocol", "auto",
    ]
    if truthy("enable_offload", flags.get("enable_offload", "false")):
        args += offload_args(os.environ)
    if "local_buffer_size" in flags:
        args += ["--local-buffer-size", size("local_buffer_size", flags["local_buffer_size"])]
    notes = [f"--{n} has no effect on Moongate: {why}" for n, why in IGNORED.items() if n in flags
             and n not in DEFAULTS]
    return args, notes


def main(argv=None):
    return run("mooncake_client", __doc__, "store", translate, argv)


if __name__ == "__main__":
    sys.exit(main())
