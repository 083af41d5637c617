#!/usr/bin/env bash
# The smallest install that runs `fedbayes client`: a virtual environment with what a client process
# imports and nothing else (no development tools, no torchvision, no Ray), from this source tree.
#
#   deploy/install-client.sh VENV [TORCH_REQUIREMENT]      # e.g. ~/fedbayes-client 'torch==2.13.0'
#
# The requirements are the container image's (deploy/docker/requirements.py: pyproject's dependencies
# minus torchvision and Flower's simulation extra, torch replaceable; default pyproject's CUDA pin);
# the project itself goes in with --no-deps. pip's own settings apply, so an offline install from a
# wheelhouse (deploy/docker/make-wheelhouse.sh) is
#   PIP_NO_INDEX=1 PIP_FIND_LINKS=$PWD/deploy/docker/wheels deploy/install-client.sh VENV 'torch==2.13.0'
# Needs Python 3.11 (PYTHON=/path/to/python3.11 to pick one). An existing VENV is refused, not reused.
set -euo pipefail
[ $# -ge 1 ] && [ $# -le 2 ] || { echo "usage: $0 VENV [TORCH_REQUIREMENT]" >&2; exit 2; }
VENV=$1
TORCH=${2:-}
PYTHON=${PYTHON:-python3.11}
cd "$(dirname "$0")/.."

"$PYTHON" -c 'import sys; assert sys.version_info[:2] == (3, 11)' 2>/dev/null \
    || { echo "install-client: $PYTHON is not Python 3.11; set PYTHON=/path/to/python3.11" >&2; exit 1; }
[ ! -e "$VENV" ] || { echo "install-client: $VENV exists; give a new directory" >&2; exit 1; }
"$PYTHON" -m venv "$VENV"
"$PYTHON" deploy/docker/requirements.py --torch "$TORCH" > "$VENV/fedbayes-requirements.txt"
"$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$VENV/fedbayes-requirements.txt"
"$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps .
echo "install-client: $("$VENV/bin/fedbayes" --help >/dev/null && echo ok), $(du -sh "$VENV" | cut -f1) in $VENV; run $VENV/bin/fedbayes client --check ..."
