"""`python -m sim` is the `parasim` command."""

from sim.entry import main

raise SystemExit(main())
