"""`python -m a2a_orchestrator.cli`: the console script's entry point."""

import sys

from .entry import main

sys.exit(main())
