"""Fixtures of the wheel's tests: real `moongate master` / `moongate store` processes on
127.0.0.1 port 0, stores and engines set up against them, and a condition wait.

Binaries: ``MOONGATE_BIN`` (the `moongate` binary) and ``MOONGATE_KV_BIN`` (the `kv`
example), else ``$CARGO_TARGET_DIR/debug/...``, else ``<repo>/target/debug/...``
(`.ci/run` builds them with `cargo test --workspace`)."""

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
MiB = 1 << 20
# Short read leases, so removing what a test just read needs no long wait.
LEASE_TTL_MS = 300


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "cuda: needs an NVIDIA GPU and torch with CUDA; runs only with MOONGATE_CUDA_TESTS=1 "
        "(and then fails, never skips, without them)",
    )
    # One cluster secret for every process of the run, away from the user's own file.
    if "MOONGATE_TRANSFER_SECRET_FILE" not in os.environ:
        d = tempfile.mkdtemp(prefix="moongate-py-tests-")
        path = os.path.join(d, "transfer-secret")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, os.urandom(32).hex().encode())
        os.close(fd)
        os.environ["MOONGATE_TRANSFER_SECRET_FILE"] = path


def pytest_collection_modifyitems(config, items):
    if os.environ.get("MOONGATE_CUDA_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="GPU test: set MOONGATE_CUDA_TESTS=1 on a machine with a GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def binary(env: str, rel: str) -> Path:
    if os.environ.get(env):
        p = Path(os.environ[env])
    else:
        target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
        p = target / "debug" / rel
    if not p.exists():
        raise RuntimeError(f"{p} is missing: build it (cargo test --workspace) or set {env}")
    return p


def wait_until(cond, timeout=10.0, what="condition"):
    """Polls `cond` until it returns a true value (returned), failing after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


class Proc:
    """A child process whose log is read until a line matches."""

    def __init__(self, args, ready: str, env=None):
        self.log = tempfile.NamedTemporaryFile(prefix="moongate-", suffix=".log", delete=False)
        self.p = subprocess.Popen(
            [str(a) for a in args],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
        pat = re.compile(ready)

        def found():
            if self.p.poll() is not None:
                raise AssertionError(f"{args[0]} exited: {self.text()}")
            return pat.search(self.text())

        self.match = wait_until(found, 30, f"{args[0]} to start")

    def text(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


class Master(Proc):
    """`moongate master` on 127.0.0.1, any free port."""

    def __init__(self, *extra, lease_ttl_ms=LEASE_TTL_MS):
        super().__init__(
            [binary("MOONGATE_BIN", "moongate"), "master", "--host", "127.0.0.1", "--port", "0",
             "--master-lease-ttl-ms", str(lease_ttl_ms), *extra],
            r"moongate master listening addr=(\S+)",
        )
        self.addr = self.match.group(1)
        self.url = f"http://{self.addr}"
        self.metadata = f"{self.url}/metadata"

    def segments(self):
        with urllib.request.urlopen(f"{self.url}/api/v1/segments", timeout=5) as r:
            return json.load(r)


@pytest.fixture(scope="session")
def master():
    m = Master()
    yield m
    m.stop()


def new_store(master, segment=64 * MiB, local=16 * MiB, metadata="P2PHANDSHAKE", protocol="tcp",
              ssd_offload_path=None):
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    offload = () if ssd_offload_path is None else (None, True, ssd_offload_path)
    rc = s.setup("127.0.0.1", metadata, segment, local, protocol, "", master.addr, *offload)
    assert rc == 0, f"setup answered {rc}"
    return s


@pytest.fixture
def store(master):
    s = new_store(master)
    yield s
    assert s.close() == 0


@pytest.fixture
def engine_pair():
    """Two initialized P2P engines in this process: (initiator, target, target session id)."""
    from mooncake.engine import TransferEngine

    a, b = TransferEngine(), TransferEngine()
    assert a.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    assert b.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    return a, b, f"127.0.0.1:{b.get_rpc_port()}"


class _ChildLog:
    """A child's stderr kept in a file: a pipe nobody reads fills (64 KiB of warnings) and
    stops the child at its next write. `read()` answers all of it so far."""

    def __init__(self, f):
        self.f = f

    def read(self):
        self.f.seek(0)
        return self.f.read()

    def close(self):
        self.f.close()


def python_child(script: str, *args, env=None):
    """Runs a helper script of this directory in a fresh interpreter (a separate process);
    its stdin and stdout are pipes, its stderr a file (`child.stderr.read()`)."""
    log = tempfile.TemporaryFile(mode="w+")
    child = subprocess.Popen(
        [sys.executable, str(HERE / script), *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env={**os.environ, **(env or {})},
    )
    child.stderr = _ChildLog(log)
    return child


def remove_when_unleased(store, key, timeout=5.0):
    """Removes `key` once its read lease ran out (Mooncake's tests sleep the lease TTL)."""
    wait_until(lambda: store.remove(key) == 0, timeout, f"removing {key!r}")
