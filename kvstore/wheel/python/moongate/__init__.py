"""Moongate's Python API: Mooncake's transfer engine and store classes over Moongate.

- ``moongate.engine``: ``TransferEngine``, ``TransferOpcode``, ``TransferNotify``
  (Mooncake's ``mooncake.engine``).
- ``moongate.store``: ``MooncakeDistributedStore``, ``ReplicateConfig``, ``SoftPinAction``
  (Mooncake's ``mooncake.store``).

The ``mooncake`` package of this wheel re-exports both under Mooncake's names, so code that
imports ``mooncake.engine`` / ``mooncake.store`` (SGLang) runs on Moongate unchanged.
"""

from moongate._native import __version__

__all__ = ["__version__"]
