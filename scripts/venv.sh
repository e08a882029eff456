# Sourced by scripts/example and scripts/test: make .venv with torch and trainbox in it.
# TRAINBOX_TORCH picks the torch requirement (default: the release this project is tested with);
# TRAINBOX_PYTHON the interpreter (default: scripts/pick-python's choice, the distribution's first).
# shellcheck shell=bash

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$root/.venv"
extras=${1:-}

if [[ ! -x "$venv/bin/python" ]]; then
  python=$("$root/scripts/pick-python" /usr/bin/python3 python3)
  "$python" -m venv "$venv"
fi
# torch first and pinned: a bare `torch` requirement would pull a multi-GB CUDA build.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${TRAINBOX_TORCH:-torch==2.13.0}"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "$root${extras:+[$extras]}"
export PATH="$venv/bin:$PATH"
