"""exec's exit hook: this folder, put first on a command's PYTHONPATH, holds the `sitecustomize`
that lets gloo's last thread finish before Python does (trainbox.process.clean_exit says why).

Only `sitecustomize.py` sits beside this file: everything here is importable by that name in the
command's Python, so the code that uses the folder lives in clean_exit.py.
"""

from __future__ import annotations

from trainbox.process.clean_exit import FOLDER, GRACE_VAR, exported, leave, strand, stranded

__all__ = ["FOLDER", "GRACE_VAR", "exported", "leave", "strand", "stranded"]
