"""Sharded sample streams: WebDataset-layout tar shards, their manifest, and the pure plan of
which rank and DataLoader worker reads which sample in which order, with a resumable position."""
