"""`python -m specsample` (and `torchrun ... -m specsample`): the command line."""

import sys

from specsample.cli import main

sys.exit(main())
