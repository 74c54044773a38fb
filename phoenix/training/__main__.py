"""``python -m phoenix.training --help``."""

import sys

from phoenix.training.cli import main

sys.exit(main())
