"""Mooncake's ``mooncake.store`` API over Moongate's store client."""

from moongate._native import (
    BufferHandle,
    Descriptor,
    DiskDescriptor,
    MemoryDescriptor,
    MooncakeDistributedStore,
    MooncakeHostMemAllocator,
    ObjectDataType,
    ReplicaDescriptor,
    ReplicaStatus,
    ReplicateConfig,
    SoftPinAction,
    get_alloc_func_addr,
    get_free_func_addr,
)

from moongate.buffer_pool import (
    BufferLease,
    BufferLeaseView,
    BufferPool,
    RegisteredBufferLease,
    RegisteredBufferLeaseView,
    RegisteredBufferPool,
)
from moongate.numa import bind_to_numa_node

__all__ = ["bind_to_numa_node", "BufferHandle", "BufferLease", "BufferLeaseView", "BufferPool",
           "RegisteredBufferLease", "RegisteredBufferLeaseView", "RegisteredBufferPool", "Descriptor", "DiskDescriptor", "MemoryDescriptor",
           "MooncakeDistributedStore", "MooncakeHostMemAllocator", "ObjectDataType", "ReplicaDescriptor", "ReplicaStatus",
           "ReplicateConfig", "SoftPinAction", "get_alloc_func_addr",
           "get_free_func_addr"]

# pybind11 exports an enum's members at module level too (``mooncake.store.COMPLETE``).
for _enum in (ReplicaStatus, ObjectDataType):
    for _name in dir(_enum):
        if _name.isupper():
            globals()[_name] = getattr(_enum, _name)
            __all__.append(_name)
del _enum, _name
