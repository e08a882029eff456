"""What the loop reads: the data contract, map-style and streamed batches behind one seam,
and DataLoader workers that are seen to start."""
