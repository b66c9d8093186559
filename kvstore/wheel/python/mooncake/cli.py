"""``mooncake.cli``: the module behind Mooncake's ``mooncake_master`` console script, here
Moongate's (``moongate.mooncake_master``), so ``python -m mooncake.cli ...`` runs it too."""

import sys

from moongate.mooncake_master import main

if __name__ == "__main__":
    sys.exit(main())
