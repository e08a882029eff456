"""Evaluation and prediction from a checkpoint, sharded over every rank of any launcher.

locate, problems, chunks, rows, files and killpoint import no torch (the CLI imports locate
before it pins CPUs); model, together, precision, workers, evaluation and prediction do.
"""
