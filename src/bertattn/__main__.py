"""``python -m bertattn`` (what ``torchrun -m bertattn`` runs)."""

import sys

from .cli import main

sys.exit(main())
