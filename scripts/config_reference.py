"""Regenerate docs/configuration.md's configuration reference from trainbox.config's dataclasses.

.venv/bin/python scripts/config_reference.py
"""

from __future__ import annotations

import re
from pathlib import Path

from trainbox.config import reference_markdown

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
BLOCK = re.compile(
    r"(<!-- config-reference:start -->\n)(?:.*?\n)?(<!-- config-reference:end -->)", re.S
)

if __name__ == "__main__":
    text = PAGE.read_text()
    if not BLOCK.search(text):
        raise SystemExit(f"{PAGE} lacks <!-- config-reference:start/end --> markers")
    PAGE.write_text(BLOCK.sub(lambda m: f"{m.group(1)}{reference_markdown()}\n{m.group(2)}", text))
