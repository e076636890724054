"""``python -m mmloader.cli``: the ``mmloader`` command."""

import sys

from . import main

sys.exit(main())
