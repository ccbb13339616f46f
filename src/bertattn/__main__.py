"""``python -m bertattn`` (what ``torchrun -m bertattn`` runs)."""

import sys

try:
    from .cli import console
except KeyboardInterrupt:  # Ctrl-C before the command line's own handling is in place
    print("bertattn: interrupted", file=sys.stderr)
    sys.exit(130)

console()
