"""Above train/ and infer/: the joined process group, peer agreement, the watchdog, errors.

group.py joins, agrees and translates failures; trainer.py is the Trainer built on it;
from_checkpoint.py is eval's and predict's path to their work on every rank.
"""
