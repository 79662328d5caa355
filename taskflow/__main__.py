"""``python -m taskflow``: the command line of :mod:`taskflow.cli`."""

from taskflow.cli import main

raise SystemExit(main())
