"""Evaluation and prediction from a checkpoint, sharded over every rank of any launcher.

locate, chunks, rows and part_files import no torch (the CLI imports locate before it pins
CPUs); model, columns, evaluation and prediction do.
"""
