"""The KV master's served OpenAPI document against what the master does, with
schemathesis: every operation of a keyed `moongate master` is fuzzed from its schema, and
every answer must be documented (status, content type, body schema), no request the
document calls invalid may be accepted, and no answer may be a server error.

Needs the `moongate` binary that `cargo test --workspace` builds (or MOONGATE_BIN) and
schemathesis (`.ci/run` installs it in its venv).
"""

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
ADMIN_KEY = "schema-fuzz-admin-key-0123456789"
STORE_KEY = "schema-fuzz-store-key-0123456789"


def moongate() -> Path:
    if "MOONGATE_BIN" in os.environ:
        return Path(os.environ["MOONGATE_BIN"])
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    p = target / "debug" / "moongate"
    assert p.exists(), f"{p} is missing: run `cargo test --workspace` (or cargo build -p moongate) first"
    return p


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_master_document_matches_the_master():
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    master = subprocess.Popen(
        [str(moongate()), "master", "--host", "127.0.0.1", "--port", str(port),
         "--admin-api-key", ADMIN_KEY, "--store-api-key", STORE_KEY],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{base}/health", timeout=1).read()
                break
            except OSError:
                assert master.poll() is None, master.stderr.read()
                assert time.monotonic() < deadline, "the master did not start"
                time.sleep(0.1)
        st = Path(sys.executable).parent / "schemathesis"
        run = subprocess.run(
            [str(st), "--config-file", str(HERE / "schemathesis.toml"), "run",
             f"{base}/api-docs/openapi.json",
             "-H", f"Authorization: Bearer {ADMIN_KEY}",
             # positive_data_acceptance: see schemathesis.toml for why it is left out.
             "--checks", "all", "--exclude-checks", "positive_data_acceptance",
             "--max-examples", "50", "--workers", "2",
             "--seed", "20261206", "--continue-on-failure"],
            capture_output=True, text=True, timeout=600,
        )
        assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-5000:]
    finally:
        master.terminate()
        master.wait(timeout=30)
