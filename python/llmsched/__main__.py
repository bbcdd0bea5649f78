"""``python -m llmsched``: the same command line as ``llmsched``."""

import sys

from llmsched.cli import main

sys.exit(main())
