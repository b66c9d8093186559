"""``mooncake.async_store``: Mooncake's store with an ``async_<name>`` coroutine for each of
its calls (``await store.async_batch_get_into(...)``), as Mooncake's module has it.

Each coroutine runs the call on the event loop's default executor. The calls release the
GIL while they wait or move bytes, so calls from many coroutines run at once.
"""

import asyncio
import functools

from mooncake.store import MooncakeDistributedStore

__all__ = ["MooncakeDistributedStore", "MooncakeDistributedStoreAsync"]


class MooncakeDistributedStoreAsync(MooncakeDistributedStore):
    """``MooncakeDistributedStore`` plus ``async_<name>`` for every callable ``<name>``."""

    def __getattr__(self, name: str):
        if not name.startswith("async_"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        call = getattr(self, name[len("async_"):], None)
        if call is None or not callable(call):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r} "
                                 f"(nor a call {name[len('async_'):]!r})")

        @functools.wraps(call)
        async def run(*args, **kwargs):
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(None, functools.partial(call, *args, **kwargs))

        return run
