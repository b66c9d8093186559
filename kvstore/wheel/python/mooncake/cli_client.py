"""``mooncake.cli_client``: the module behind Mooncake's ``mooncake_client`` console script, here
Moongate's (``moongate.mooncake_client``), so ``python -m mooncake.cli_client ...`` runs it too."""

import sys

from moongate.mooncake_client import main

if __name__ == "__main__":
    sys.exit(main())
