"""The DDP training loop and what it needs: data order, schedule, checkpoints, metrics."""
