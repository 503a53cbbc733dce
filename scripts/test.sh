#!/usr/bin/env bash
# The whole test suite (slow tests included), after setting up .venv if needed. Without arguments it first runs
# the core package's tests in a venv that has only `pip install .` (scripts/test_core.sh: no torch, no extra).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $# -eq 0 ]]; then
  scripts/test_core.sh
fi
scripts/setup.sh
export PJRT_DEVICE=CPU
exec .venv/bin/python -m pytest -q "$@"
