"""One side of SGLang's PD KV transfer (`disaggregation/mooncake/conn.py`), as a separate
process: `pd_worker.py decode` or `pd_worker.py prefill`, with `cuda` after it for KV
buffers in GPU memory (and `ipc` for SGLang's `rdma` protocol: CUDA IPC on one host) (torch tensors on cuda:0, as SGLang's are; aux buffers stay on the
CPU, as SGLang's do). Without it numpy arrays stand in for the per-layer KV buffers. Lines
of JSON on stdin/stdout stand in for SGLang's ZMQ messages."""

import json
import sys

import numpy as np

from mooncake.engine import TransferEngine

LAYERS, PAGES, ITEM_LEN = 4, 64, 8192  # item_len: bytes of one page of one layer
AUX_LEN = 256


def page_bytes(layer: int, page: int) -> np.ndarray:
    return np.random.default_rng(layer * 100_003 + page).integers(0, 256, ITEM_LEN, dtype=np.uint8)


CUDA = "cuda" in sys.argv[2:]
# SGLang's protocol is "rdma": without an RDMA NIC the engine falls back to TCP, and uses
# shared memory and CUDA IPC with same-host peers. Plain "tcp" stages everything over TCP.
PROTOCOL = "rdma" if "ipc" in sys.argv[2:] else "tcp"


class Kv:
    """One layer's KV buffer: a numpy array, or a torch uint8 tensor on cuda:0."""

    def __init__(self):
        if CUDA:
            import torch

            self.t = torch.zeros(PAGES * ITEM_LEN, dtype=torch.uint8, device="cuda:0")
        else:
            self.t = np.zeros(PAGES * ITEM_LEN, dtype=np.uint8)

    def ptr(self) -> int:
        return self.t.data_ptr() if CUDA else self.t.ctypes.data

    def nbytes(self) -> int:
        return PAGES * ITEM_LEN

    def set_page(self, page: int, data: np.ndarray):
        at = slice(page * ITEM_LEN, (page + 1) * ITEM_LEN)
        if CUDA:
            import torch

            self.t[at] = torch.from_numpy(data).to("cuda:0")
        else:
            self.t[at] = data

    def host(self) -> np.ndarray:
        if CUDA:
            import torch

            torch.cuda.synchronize()
            return self.t.cpu().numpy()
        return self.t


def start():
    engine = TransferEngine()
    # MooncakeTransferEngine.initialize: P2P handshake; session id from get_rpc_port().
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", PROTOCOL, "") == 0
    session = f"127.0.0.1:{engine.get_rpc_port()}"
    kv = [Kv() for _ in range(LAYERS)]
    aux = np.zeros(AUX_LEN, dtype=np.uint8)
    # register_buffer_to_engine: one batch_register of every KV and aux buffer (SGLang
    # passes no location: the engine finds device pointers itself).
    ptrs = [b.ptr() for b in kv] + [aux.ctypes.data]
    lens = [b.nbytes() for b in kv] + [aux.nbytes]
    assert engine.batch_register_memory(ptrs, lens) == 0
    return engine, session, kv, aux


def runs(pairs):
    """group_concurrent_contiguous: (src, dst, n) runs of consecutive pages on both sides."""
    out = []
    for s, d in pairs:
        if out and out[-1][0] + out[-1][2] == s and out[-1][1] + out[-1][2] == d:
            out[-1][2] += 1
        else:
            out.append([s, d, 1])
    return out


def decode():
    engine, session, kv, aux = start()
    print(json.dumps({"session": session, "kv_ptrs": [b.ptr() for b in kv],
                      "aux_ptr": aux.ctypes.data, "item_len": ITEM_LEN}), flush=True)
    msg = json.loads(sys.stdin.readline())  # the prefill side says it is done
    host = [b.host() for b in kv]
    bad = [(layer, s, d) for layer in range(LAYERS) for s, d in msg["pairs"]
           if not (host[layer][d * ITEM_LEN:(d + 1) * ITEM_LEN] == page_bytes(layer, s)).all()]
    untouched = set(range(PAGES)) - {d for _, d in msg["pairs"]}
    stray = [p for p in untouched if host[0][p * ITEM_LEN:(p + 1) * ITEM_LEN].any()]
    aux_ok = bytes(aux[:8]) == b"aux-meta"
    print(json.dumps({"bad": bad, "stray": stray, "aux_ok": aux_ok}), flush=True)


def prefill():
    engine, _, kv, aux = start()
    for layer in range(LAYERS):
        for p in range(PAGES):
            kv[layer].set_page(p, page_bytes(layer, p))
    if CUDA:
        import torch

        torch.cuda.synchronize()
    aux[:8] = np.frombuffer(b"aux-meta", dtype=np.uint8)
    peer = json.loads(sys.stdin.readline())
    pairs = peer["pairs"]
    session, item = peer["session"], peer["item_len"]
    assert engine.send_probe(session) == 0
    srcs, dsts, lens = [], [], []
    for layer in range(LAYERS):
        for s, d, n in runs(pairs):
            srcs.append(kv[layer].ptr() + s * item)
            dsts.append(peer["kv_ptrs"][layer] + d * item)
            lens.append(n * item)
    rc = engine.batch_transfer_sync_write(session, srcs, dsts, lens)
    rc_aux = engine.transfer_sync_write(session, aux.ctypes.data, peer["aux_ptr"], AUX_LEN)
    print(json.dumps({"rc": rc, "rc_aux": rc_aux, "requests": len(srcs)}), flush=True)


if __name__ == "__main__":
    {"decode": decode, "prefill": prefill}[sys.argv[1]]()
