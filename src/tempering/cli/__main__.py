"""``python -m tempering.cli``: the ``tempering`` command."""

import sys

from tempering.cli import main

sys.exit(main())
