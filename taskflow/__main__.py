"""``python -m taskflow``: the command line of ``taskflow.cli``."""

from taskflow.cli import main

raise SystemExit(main())
