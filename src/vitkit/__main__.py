"""`python -m vitkit` (and `torchrun -m vitkit`) runs the command line."""

from vitkit.cli import _entry

_entry()
