"""Built-in tasks: factories usable as `model.factory` / `data.factory` without any user code."""
