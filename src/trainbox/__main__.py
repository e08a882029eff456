"""`python -m trainbox` is the same as the `trainbox` console script."""

from trainbox.cli import main

raise SystemExit(main())
