"""``python -m ravex``."""

import sys

from ravex.cli import main

sys.exit(main())
