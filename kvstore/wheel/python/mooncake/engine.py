"""``mooncake.engine`` as Moongate provides it (see ``moongate.engine``)."""

from moongate.engine import *  # noqa: F401,F403
from moongate.engine import __all__  # noqa: F401
