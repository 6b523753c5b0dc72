"""``python -m cachecompact``: the command line (`cachecompact.tools.cli`)."""

import sys

from .tools.cli import main

sys.exit(main())
