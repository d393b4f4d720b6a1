"""Allow ``python -m slurmtools``."""
from slurmtools.cli import main

raise SystemExit(main())
