"""``python -m labeller.cli``: the command line (the ``gpu-labeller`` program without its SIGINT handling)."""

import sys

from labeller.cli.root import main

sys.exit(main())
