"""``python -m inferpool`` is the ``inferpool`` command."""

import sys

from inferpool.cli import launch

sys.exit(launch())
