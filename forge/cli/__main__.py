"""`python -m forge.cli`: the forge command."""

import sys

from forge.cli import main

sys.exit(main())
