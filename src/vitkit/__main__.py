"""`python -m vitkit` (and `torchrun -m vitkit`) runs the command line."""

import sys

from vitkit.cli import main

sys.exit(main(since_process_start=True))
