"""`trainbox doctor --network`: an all-reduce sweep and a ring of neighbour links, judged."""
