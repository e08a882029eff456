"""trainbox: one entrypoint that detects its launcher and runs PyTorch DDP the same everywhere."""

__version__ = "0.1.0"
