"""The SSD tier's read path through Mooncake's Python API, for Mooncake's wheel and
Moongate's alike: a client with a SEGMENT_MIB segment and `enable_ssd_offload` puts VALUES
values of 1 MiB (each put retried for up to 2 s), waits until the first values are on disk
only and every value has its disk replica (no write competes with the reads), writes the
page cache back and drops it (root), then reads them back with `get` and checks every byte.
Prints one `RESULT {json}` line.

    python ssd_bench.py MASTER_ADDR SSD_DIR [VALUES] [SEGMENT_MIB]
"""

import json
import os
import sys
import time

from mooncake.store import MooncakeDistributedStore

MiB = 1 << 20


def value(i: int) -> bytes:
    return i.to_bytes(8, "little") * (MiB // 8)


def main():
    master, path = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 512
    segment = int(sys.argv[4]) if len(sys.argv) > 4 else 64
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", "P2PHANDSHAKE", segment * MiB, 64 * MiB, "tcp", "", master,
                 None, True, path)
    assert rc == 0, f"setup: {rc}"
    t0 = time.perf_counter()
    accepted = []
    for i in range(n):
        deadline = time.monotonic() + 2
        while s.put(f"ssd/{i}", value(i)) != 0:
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
        else:
            accepted.append(i)
    put_s = time.perf_counter() - t0
    # The first values: evicted from the segment, so on disk only once offloaded.
    cold = [i for i in accepted if i < n - 2 * segment]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        descs = s.batch_get_replica_desc([f"ssd/{i}" for i in cold])
        on_disk = sum(1 for i in cold
                      if descs.get(f"ssd/{i}")
                      and all(not r.is_memory_replica() for r in descs[f"ssd/{i}"]))
        if on_disk == len(cold):
            break
        time.sleep(0.5)
    # The disk tier idle before the reads (no write of a later value competing with
    # them): every accepted value has its disk replica.
    everything = [f"ssd/{i}" for i in accepted]
    while time.monotonic() < deadline:
        descs = s.batch_get_replica_desc(everything)
        written = sum(1 for k in everything
                      if descs.get(k) and any(not r.is_memory_replica() for r in descs[k]))
        if written == len(everything):
            break
        time.sleep(0.5)
    # Written back first: dropping the page cache leaves dirty pages where they are, and
    # a read of those is a read of memory.
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
        dropped = True
    except OSError:
        dropped = False
    t0 = time.perf_counter()
    good = 0
    for i in cold:
        if s.get(f"ssd/{i}") == value(i):
            good += 1
    read_s = time.perf_counter() - t0
    print("RESULT " + json.dumps({
        "accepted": len(accepted), "values": n, "put_s": round(put_s, 3),
        "cold": len(cold), "on_disk_before_read": on_disk, "read_ok": good,
        "all_on_disk_before_read": written == len(everything),
        "read_s": round(read_s, 3), "read_gbps": round(len(cold) * MiB / read_s / 1e9, 3),
        "page_cache_dropped": dropped,
    }), flush=True)
    s.close()


if __name__ == "__main__":
    main()
