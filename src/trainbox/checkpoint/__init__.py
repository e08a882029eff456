"""Checkpoints: the one payload schema (`schema`), the crash-safe files (`files`), background
writes (`saver`). Below `train/` and `infer/`, which both read checkpoints through it."""
