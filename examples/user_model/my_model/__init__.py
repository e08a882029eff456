"""A user's model package: a small 1-D conv net that tells signal regimes apart."""

from my_model.factories import REGIMES, data, model

__all__ = ["REGIMES", "data", "model"]
