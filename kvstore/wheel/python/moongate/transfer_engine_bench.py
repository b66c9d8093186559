"""``transfer_engine_bench``: Mooncake's transfer engine benchmark command line, running
Moongate's ``transfer-bench`` (``$TRANSFER_BENCH_BIN`` or ``transfer-bench`` on ``PATH``).

A target serves a registered buffer; an initiator reads or writes it in batches of blocks
for ``--duration`` seconds and reports the throughput.

- mapped: ``--mode``, ``--segment_id`` (the target's ``host:port``), ``--local_server_name``
  (where a target listens; a bare host gets a free port, printed by the target),
  ``--metadata_server`` (``P2PHANDSHAKE`` or Mooncake's HTTP metadata URL), ``--protocol``
  (``tcp`` or ``rdma``), ``--operation``, ``--block_size``, ``--batch_size``,
  ``--buffer_size``, ``--duration``, ``--threads``, with Mooncake's defaults where they
  differ (64 KiB blocks, batches of 128, 1 GB buffers, 10 s, 12 threads, reads);
- accepted without effect, with the reason: ``--device_name``, ``--auto_discovery``,
  ``--nic_priority_matrix``, ``--report_unit``, ``--report_precision``;
- refused with the reason: etcd metadata, other transports, ``--backend=tent``.

``--print`` prints the ``transfer-bench`` command line instead of running it.
"""

import sys

from moongate._gflags import FlagError, binary, parse_flags, run

DEFAULTS = {"mode": "initiator", "metadata_server": "P2PHANDSHAKE", "protocol": "rdma",
            "operation": "read", "block_size": "65536", "batch_size": "128",
            "buffer_size": "1073741824", "duration": "10", "threads": "12",
            "local_server_name": "0.0.0.0", "backend": "classic"}
IGNORED = {
    "device_name": "RDMA devices are found by the transfer engine",
    "auto_discovery": "RDMA devices are found by the transfer engine",
    "nic_priority_matrix": "RDMA devices are found by the transfer engine",
    "report_unit": "transfer-bench reports GB/s (and --json)",
    "report_precision": "transfer-bench reports GB/s (and --json)",
}
VALUED = set(DEFAULTS) | {"segment_id", "device_name", "nic_priority_matrix", "report_unit",
                          "report_precision"}
BOOLS = {"auto_discovery"}


def _count(name, value):
    try:
        n = int(value)
    except ValueError:
        raise FlagError(f"--{name}: {value!r} is not a number") from None
    if n <= 0:
        raise FlagError(f"--{name}: must be positive")
    return str(n)


def translate(argv):
    """The ``transfer-bench`` arguments and the notes for Mooncake's command line ``argv``;
    raises FlagError for what Moongate cannot do."""
    given = parse_flags(argv, VALUED | BOOLS, BOOLS)
    f = {**DEFAULTS, **given}
    if f["mode"] not in ("initiator", "target"):
        raise FlagError(f"--mode={f['mode']}: initiator or target")
    if f["backend"] != "classic":
        raise FlagError(f"--backend={f['backend']}: Moongate has one transfer engine")
    if f["protocol"] not in ("tcp", "rdma"):
        raise FlagError(f"--protocol={f['protocol']}: Moongate's engine speaks tcp and rdma")
    if f["operation"] not in ("read", "write"):
        raise FlagError(f"--operation={f['operation']}: read or write")
    meta = f["metadata_server"]
    if meta == "P2PHANDSHAKE":
        meta = "p2p"
    elif not meta.startswith(("http://", "https://")):
        raise FlagError(f"--metadata_server={meta}: P2PHANDSHAKE or an http(s):// metadata "
                        "URL (Moongate keeps no transfer metadata in etcd)")
    host = f["local_server_name"]
    listen = host if host.count(":") == 1 else f"{host}:0"
    args = ["--mode", f["mode"], "--metadata", meta, "--protocol", f["protocol"],
            "--listen", listen,
            "--buffer-size", _count("buffer_size", f["buffer_size"]),
            "--threads", _count("threads", f["threads"])]
    if f["mode"] == "initiator":
        if "segment_id" not in given:
            raise FlagError("--segment_id is required (the target's host:port)")
        args += ["--segment", given["segment_id"], "--op", f["operation"],
                 "--block-size", _count("block_size", f["block_size"]),
                 "--batch-size", _count("batch_size", f["batch_size"]),
                 "--duration", _count("duration", f["duration"])]
    notes = [f"--{n} has no effect on Moongate: {why}" for n, why in IGNORED.items() if n in given]
    return args, notes


def main(argv=None):
    program = lambda: binary("TRANSFER_BENCH_BIN", "transfer-bench",  # noqa: E731
                             "cargo install --path transfer --bin transfer-bench")
    return run("transfer_engine_bench", __doc__, None, translate, argv, program)


if __name__ == "__main__":
    sys.exit(main())
