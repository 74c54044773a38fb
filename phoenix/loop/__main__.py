"""``python -m phoenix.loop``: the whole loop (``make loop``; docs/loop.md)."""

import sys

from phoenix.loop.cli import main

if __name__ == "__main__":
    sys.exit(main())
