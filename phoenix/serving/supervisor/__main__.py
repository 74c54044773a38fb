import sys

from phoenix.serving.supervisor.cli import main

sys.exit(main())
