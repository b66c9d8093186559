"""A store client in its own process with a disk tier (Mooncake's `enable_ssd_offload`):
sets up against the master at argv[1] with a `argv[3]`-MiB segment and its disk at argv[2],
puts argv[4] values of 1 MiB (`value(i)`, each put retried for up to 2 s, as the issue's
measurement of Mooncake did), prints "accepted N" and waits for its stdin to close (or its
SIGKILL)."""

import sys
import time

from mooncake.store import MooncakeDistributedStore

MiB = 1 << 20


def value(i: int) -> bytes:
    return bytes([i % 251]) * 1024 + i.to_bytes(4, "little") * ((MiB - 1024) // 4)


if __name__ == "__main__":
    master, path, segment, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", "P2PHANDSHAKE", segment * MiB, 16 * MiB, "tcp", "", master,
                 None, True, path)
    assert rc == 0, rc
    accepted = 0
    for i in range(n):
        deadline = time.monotonic() + 2
        while s.put(f"ssd/{i}", value(i)) != 0:
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
        else:
            accepted += 1
    print(f"accepted {accepted}", flush=True)
    sys.stdin.read()
