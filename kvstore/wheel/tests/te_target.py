"""A transfer-engine target in its own process: registers a managed buffer, prints
`{"session", "addr"}` as one JSON line and serves until its stdin closes."""

import json
import sys

from mooncake.engine import TransferEngine

e = TransferEngine()
assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
addr = e.allocate_managed_buffer(16 << 20)
assert addr != 0
print(json.dumps({"session": f"127.0.0.1:{e.get_rpc_port()}", "addr": addr}), flush=True)
sys.stdin.read()
