"""Checks that a node can run its share of the job (NVML facts, judged by pure functions)."""
