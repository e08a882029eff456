"""Write a seeded synthetic 3-class tabular problem as train.csv and val.csv.

Make the data, then train on it (from the repository root):

    python examples/tabular/make_csv.py /tmp/tab
    trainbox run --config examples/tabular/config.yaml \
        data.args.train_csv=/tmp/tab/train.csv data.args.val_csv=/tmp/tab/val.csv

Classes sit around three centres in the (x1, x2) plane, x3 is a weak nonlinear hint, x4's spread
depends on the class, and x5 and x6 are pure noise, so a model must learn which columns matter.
"""

from __future__ import annotations

import argparse
import csv
import math
import random
from pathlib import Path

CLASSES = ("alpha", "beta", "gamma")
HEADER = ("x1", "x2", "x3", "x4", "x5", "x6", "label")


def rows(count: int, rng: random.Random) -> list[tuple[float | str, ...]]:
    """`count` rows of six features and a class name, balanced in expectation."""
    out: list[tuple[float | str, ...]] = []
    for _ in range(count):
        k = rng.randrange(len(CLASSES))
        angle = 2 * math.pi * k / len(CLASSES)
        x1 = 1.5 * math.cos(angle) + rng.gauss(0, 0.9)
        x2 = 1.5 * math.sin(angle) + rng.gauss(0, 0.9)
        x3 = x1 * x2 + rng.gauss(0, 1.0)
        x4 = rng.gauss(0, 0.5 + k)
        x5, x6 = rng.gauss(0, 1), rng.uniform(-2, 2)
        out.append((*(round(x, 4) for x in (x1, x2, x3, x4, x5, x6)), CLASSES[k]))
    return out


def write(path: Path, table: list[tuple[float | str, ...]]) -> None:
    """One CSV file with a header row."""
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(HEADER)
        writer.writerows(table)


def main() -> None:
    """Parse the command line and write both files."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", type=Path, default=Path(__file__).parent)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-rows", type=int, default=3000)
    parser.add_argument("--val-rows", type=int, default=1000)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    write(args.out / "train.csv", rows(args.train_rows, rng))
    write(args.out / "val.csv", rows(args.val_rows, rng))
    print(f"wrote {args.out / 'train.csv'} ({args.train_rows} rows), {args.out / 'val.csv'}")


if __name__ == "__main__":
    main()
