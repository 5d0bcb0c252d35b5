"""``python -m capo_train.viewer RUN_DIR ...``: the same as ``capo view``."""

import sys

from . import view_main

sys.exit(view_main())
