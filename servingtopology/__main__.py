"""`python -m servingtopology`: the same as the `servingtopology` command."""

from servingtopology.cli.main import main

raise SystemExit(main())
