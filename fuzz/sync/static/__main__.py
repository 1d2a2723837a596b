"""``python -m fuzz.sync.static [options] [PATH…]``: the same as ``kvfuzz check-sync``."""

import sys

from ..cli import main

sys.exit(main(sys.argv[1:]))
