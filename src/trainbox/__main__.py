"""`python -m trainbox` is the same as the `trainbox` console script."""

from trainbox.cli import program

raise SystemExit(program())
