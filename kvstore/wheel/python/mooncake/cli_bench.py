"""``mooncake.cli_bench``: the module behind Mooncake's ``transfer_engine_bench`` console script, here
Moongate's (``moongate.transfer_engine_bench``), so ``python -m mooncake.cli_bench ...`` runs it too."""

import sys

from moongate.transfer_engine_bench import main

if __name__ == "__main__":
    sys.exit(main())
