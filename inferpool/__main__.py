"""``python -m inferpool`` is the ``inferpool`` command."""

import sys

from inferpool.cli import main

sys.exit(main())
