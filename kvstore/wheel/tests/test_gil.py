"""The GIL is released while bytes move: a transfer waiting on a stopped peer leaves the
other Python threads running, and one of them is what lets the peer go on."""

import json
import os
import signal
import sys
import threading

import numpy as np

from conftest import python_child
from mooncake.engine import TransferEngine


def test_a_waiting_transfer_leaves_other_threads_running():
    child = python_child("te_target.py")
    try:
        peer = json.loads(child.stdout.readline())
        e = TransferEngine()
        assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        src = np.ones(8 << 20, dtype=np.uint8)
        assert e.register_memory(src.ctypes.data, src.nbytes) == 0
        # Connections open while the peer runs.
        assert e.transfer_sync_write(peer["session"], src.ctypes.data, peer["addr"], 4096) == 0
        os.kill(child.pid, signal.SIGSTOP)
        entered, result = threading.Event(), []

        def profile(frame, event, arg):
            if event == "c_call" and getattr(arg, "__name__", "") == "transfer_sync_write":
                entered.set()

        def writer():
            sys.setprofile(profile)
            try:
                result.append(e.transfer_sync_write(peer["session"], src.ctypes.data, peer["addr"], src.nbytes))
            finally:
                sys.setprofile(None)

        t = threading.Thread(target=writer)
        t.start()
        assert entered.wait(10)
        # This thread runs while the writer waits inside the call: it resumes the peer, and
        # only then can the write complete (with the GIL held it would time out instead).
        os.kill(child.pid, signal.SIGCONT)
        t.join(60)
        assert result == [0]
    finally:
        os.kill(child.pid, signal.SIGCONT)
        child.stdin.close()
        child.wait(10)
