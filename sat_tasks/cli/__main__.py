"""`python -m sat_tasks.cli`: the `sat` command."""

import sys

from sat_tasks.cli import main

sys.exit(main())
