"""``mooncake.buffer_pool``: the local-buffer pools, as Mooncake's module names them (see
``moongate.buffer_pool``)."""

from moongate.buffer_pool import BufferPool, RegisteredBufferPool

__all__ = ["BufferPool", "RegisteredBufferPool"]
