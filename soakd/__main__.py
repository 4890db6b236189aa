"""``python -m soakd``: the same as the ``soakd`` command."""

import sys

from soakd.cli import main

sys.exit(main())
