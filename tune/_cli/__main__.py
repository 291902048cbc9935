"""``python -m tune._cli ARGS`` runs the ``tune`` command (what the console script does)."""

import sys

from tune._cli.main import main

sys.exit(main())
