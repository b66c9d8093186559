"""Mooncake's ``mooncake.store`` API over Moongate's store client."""

from moongate._native import (
    BufferHandle,
    MooncakeDistributedStore,
    ReplicateConfig,
    SoftPinAction,
)

__all__ = ["BufferHandle", "MooncakeDistributedStore", "ReplicateConfig", "SoftPinAction"]
