"""Mooncake's package names, provided by Moongate's wheel.

``from mooncake.engine import TransferEngine`` and
``from mooncake.store import MooncakeDistributedStore`` resolve to Moongate's classes. This
package clashes with a real Mooncake install (``mooncake-transfer-engine*``), which ships
a package of the same name: install one or the other per virtual environment (the one
installed last owns the files). ``mooncake.__moongate__`` is True here.
"""

__moongate__ = True
