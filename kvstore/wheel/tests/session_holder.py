"""A store client in its own process that holds sessions and is killed: sets up against the
master at argv[1] (no segment of its own), starts a put session on argv[2] and writes half
of it, starts a get session on argv[3], prints "ready" and waits for its stdin to close."""

import sys

import numpy as np
from mooncake.store import MooncakeDistributedStore

master, put_key, get_key = sys.argv[1:4]
s = MooncakeDistributedStore()
assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", master) == 0
buf = np.full(1 << 16, 7, dtype=np.uint8)
assert s.register_buffer(buf.ctypes.data, buf.nbytes) == 0
assert s.batch_put_session_start([put_key], [buf.nbytes]) == [0]
half = buf.nbytes // 2
assert s.batch_put_from_multi_buffer_ranges([put_key], [[buf.ctypes.data]], [[half]], [[0]]) == [half]
assert s.batch_get_session_start([get_key]) == [0]
print("ready", flush=True)
sys.stdin.read()
