"""`trainbox doctor --network`: collective sweeps and a ring of neighbour links, judged."""
