"""`python -m sim` is the `parasim` command."""

from sim.cli import main

raise SystemExit(main())
