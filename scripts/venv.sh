# Sourced by scripts/example and scripts/test: make .venv with torch and trainbox in it.
# TRAINBOX_TORCH picks the torch requirement (default: the release this project is tested with).
# shellcheck shell=bash

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$root/.venv"
extras=${1:-}

if [[ ! -x "$venv/bin/python" ]]; then
  python3 -m venv "$venv"
fi
# torch first and pinned: a bare `torch` requirement would pull a multi-GB CUDA build.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${TRAINBOX_TORCH:-torch==2.13.0}"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "$root${extras:+[$extras]}"
export PATH="$venv/bin:$PATH"
