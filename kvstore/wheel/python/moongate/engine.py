"""Mooncake's ``mooncake.engine`` API over Moongate's transfer engine."""

from moongate._native import (
    InnerTransferEngine,
    TransferEngine,
    TransferNotify,
    TransferOpcode,
)

# Mooncake exports the opcode values at module level too.
Read = TransferOpcode.Read
Write = TransferOpcode.Write
TransferEngine.TransferOpcode = TransferOpcode

# Mooncake's build flags: this wheel moves bytes over TCP, shared memory and RDMA only.
SUPPORT_CUDA = False
SUPPORT_EFA = False
SUPPORT_HIP = False
SUPPORT_INTRA_NVLINK = False
SUPPORT_MNNVL = False
SUPPORT_MUSA = False

__all__ = [
    "InnerTransferEngine",
    "TransferEngine",
    "TransferNotify",
    "TransferOpcode",
    "Read",
    "Write",
    "SUPPORT_CUDA",
    "SUPPORT_EFA",
    "SUPPORT_HIP",
    "SUPPORT_INTRA_NVLINK",
    "SUPPORT_MNNVL",
    "SUPPORT_MUSA",
]
