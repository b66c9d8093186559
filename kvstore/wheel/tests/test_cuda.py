"""`mooncake.engine` with KV pages in GPU memory: torch CUDA tensors registered by
`data_ptr()` (with and without a location label), written and read by a peer, and the
byte helpers on device memory. GPU only: runs with MOONGATE_CUDA_TESTS=1 (see conftest)."""

import numpy as np
import pytest

from conftest import MiB

pytestmark = pytest.mark.cuda


@pytest.fixture
def torch():
    import torch

    assert torch.cuda.is_available(), "MOONGATE_CUDA_TESTS=1 needs a GPU torch can use"
    return torch


def pattern(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


@pytest.mark.parametrize("protocol", ["tcp", "rdma"])
def test_a_torch_tensor_round_trips_through_the_engine(torch, protocol):
    from mooncake.engine import TransferEngine

    a, b = TransferEngine(), TransferEngine()
    assert a.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, "") == 0
    assert b.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, "") == 0
    target = f"127.0.0.1:{b.get_rpc_port()}"
    n = 8 * MiB + 123
    gpu = torch.zeros(n, dtype=torch.uint8, device="cuda:0")
    other = torch.zeros(n, dtype=torch.uint8, device="cuda:0")
    host, back = pattern(n, 7), np.zeros(n, dtype=np.uint8)
    # SGLang passes no location; Mooncake's label may be given too.
    assert b.register_memory(gpu.data_ptr(), n) == 0
    assert a.register_memory(other.data_ptr(), n, "cuda:0") == 0
    assert a.batch_register_memory([host.ctypes.data, back.ctypes.data], [n, n]) == 0
    # A device pointer labelled as host memory is refused (it is not a host mapping).
    spare = torch.zeros(4096, dtype=torch.uint8, device="cuda:0")
    assert a.register_memory(spare.data_ptr(), 4096, "cpu:0") == -1

    # Host -> peer's GPU, peer's GPU -> host, peer's GPU -> own GPU.
    assert a.transfer_sync_write(target, host.ctypes.data, gpu.data_ptr(), n) == 0
    torch.cuda.synchronize()
    assert np.array_equal(gpu.cpu().numpy(), host)
    assert a.transfer_sync_read(target, back.ctypes.data, gpu.data_ptr(), n) == 0
    assert np.array_equal(back, host)
    assert a.transfer_sync_read(target, other.data_ptr(), gpu.data_ptr(), n) == 0
    torch.cuda.synchronize()
    assert torch.equal(other, gpu)
    # Pages at raw offsets, as SGLang's PD computes them.
    item = 4096
    srcs = [host.ctypes.data + p * item for p in (0, 5, 9)]
    dsts = [gpu.data_ptr() + p * item for p in (100, 3, 50)]
    gpu.zero_()
    torch.cuda.synchronize()
    assert a.batch_transfer_sync_write(target, srcs, dsts, [item] * 3) == 0
    torch.cuda.synchronize()
    got = gpu.cpu().numpy()
    for s, d in zip((0, 5, 9), (100, 3, 50)):
        assert np.array_equal(got[d * item:(d + 1) * item], host[s * item:(s + 1) * item])
    # The byte helpers work on device memory too.
    assert b.write_bytes_to_buffer(gpu.data_ptr() + 10, b"on the gpu", 10) == 0
    assert b.read_bytes_from_buffer(gpu.data_ptr() + 10, 10) == b"on the gpu"
    assert a.unregister_memory(other.data_ptr()) == 0
    assert b.unregister_memory(gpu.data_ptr()) == 0
