"""`python -m specsample.cli`."""

import sys

from specsample.cli import main

sys.exit(main())
