"""``python -m bridge`` is ``hpcbridge``: the local cluster starts its nodes this way."""

import sys

from bridge.cli import main

sys.exit(main())
