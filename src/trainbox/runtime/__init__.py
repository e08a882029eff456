"""Above train/ and infer/: the joined process group, peer agreement, the watchdog, errors.

group.py joins, agrees and translates failures; trainer.py is the Trainer built on it.
"""
