"""``python -m samattn.bench``: see samattn.bench."""

import sys

from .cli import main

sys.exit(main())
