"""``mooncake.store`` as Moongate provides it (see ``moongate.store``)."""

from moongate.store import *  # noqa: F401,F403
from moongate.store import __all__  # noqa: F401
