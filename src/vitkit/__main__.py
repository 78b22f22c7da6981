"""`python -m vitkit`, `torchrun -m vitkit` and the `vitkit` console script: the command line.

Ctrl-C while the command's modules load (torch takes seconds) ends it as Ctrl-C ends a verb: one line and
status 130, not a traceback from inside an import."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from vitkit.cli import _entry

        _entry()
    except KeyboardInterrupt:  # a verb handles its own; this is one before a verb runs
        print("vitkit: interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
