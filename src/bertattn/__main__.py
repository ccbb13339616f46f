"""``python -m bertattn`` (what ``torchrun -m bertattn`` runs)."""

import sys

try:
    from .cli import console
except KeyboardInterrupt:  # Ctrl-C before the command line's own handling is in place
    # the command's name as the command line would say it (its first word), from argv alone:
    # nothing else is imported yet
    first = sys.argv[1] if len(sys.argv) > 1 else ""
    named = first[:1].isalpha() and all(c.isalpha() or c == "-" for c in first)
    print(f"bertattn {first}: interrupted" if named else "bertattn: interrupted", file=sys.stderr)
    sys.exit(130)

console()
