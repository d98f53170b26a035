"""``python -m lstmgrad`` -> :func:`lstmgrad.tools.cli.main`."""

import sys

from .tools.cli import main

sys.exit(main())
