"""``python -m relmem`` is the ``relmem`` command."""

import sys

from relmem.cli import main

sys.exit(main())
