"""``python -m lstmgrad`` -> :func:`lstmgrad.cli.main`."""

import sys

from .cli import main

sys.exit(main())
