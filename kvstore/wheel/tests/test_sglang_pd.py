"""SGLang's PD disaggregation over `mooncake.engine` with the prefill writer and the decode
receiver as separate processes (see `pd_worker.py`): P2P handshake, `get_rpc_port`
session ids, `batch_register_memory`, `send_probe`, `batch_transfer_sync_write` into the
decode process's raw addresses (`dst_ptr + page_index * item_len`)."""

import json

import pytest

from conftest import python_child


def run_pd(*mode):
    """Runs SGLang's PD sequence between a decode and a prefill process (`mode`: "cuda" for
    KV buffers in GPU memory)."""
    decode = python_child("pd_worker.py", "decode", *mode)
    prefill = python_child("pd_worker.py", "prefill", *mode)
    try:
        info = json.loads(decode.stdout.readline() or "null")
        assert info, decode.stderr.read()
        # Scattered destination pages, some runs contiguous on both sides.
        pairs = [[0, 10], [1, 11], [2, 12], [7, 3], [8, 40], [9, 41], [63, 0]]
        prefill.stdin.write(json.dumps({**info, "pairs": pairs}) + "\n")
        prefill.stdin.flush()
        sent = json.loads(prefill.stdout.readline() or "null")
        assert sent, prefill.stderr.read()
        assert sent["rc"] == 0 and sent["rc_aux"] == 0
        assert sent["requests"] == 4 * 4  # 4 layers x 4 contiguous runs
        decode.stdin.write(json.dumps({"pairs": pairs}) + "\n")
        decode.stdin.flush()
        seen = json.loads(decode.stdout.readline() or "null")
        assert seen == {"bad": [], "stray": [], "aux_ok": True}, decode.stderr.read()
        assert prefill.wait(30) == 0 and decode.wait(30) == 0
    finally:
        for p in (decode, prefill):
            if p.poll() is None:
                p.kill()


def test_prefill_writes_pages_into_a_decode_process():
    run_pd()


@pytest.mark.cuda
def test_prefill_writes_gpu_pages_into_a_decode_process_over_staged_tcp():
    run_pd("cuda")


@pytest.mark.cuda
def test_prefill_writes_gpu_pages_into_a_decode_process_through_cuda_ipc():
    run_pd("cuda", "ipc")
