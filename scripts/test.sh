#!/usr/bin/env bash
# The whole test suite (slow tests included), after setting up .venv if needed.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PJRT_DEVICE=CPU
exec .venv/bin/python -m pytest -q "$@"
