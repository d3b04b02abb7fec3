"""``python -m asyncsync`` runs the command line."""

import sys

from asyncsync.cli import main

sys.exit(main())
