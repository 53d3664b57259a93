"""``python -m kvcore`` is the ``kvcore`` command line."""

from kvcore.cli import main

raise SystemExit(main())
