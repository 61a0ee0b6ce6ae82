"""``python -m ddp_lab`` is the ``ddp-lab`` command, for environments without the script."""

import sys

from ddp_lab.tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
