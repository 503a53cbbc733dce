#!/usr/bin/env bash
# The whole test suite (slow tests included), after setting up .venv if needed.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PJRT_DEVICE=CPU
if [[ "${CI:-}" == true ]]; then
  # CI clones into a private folder; the sandboxed runs of the suite's programs (as nobody) must be able to reach
  # the checkout, as they can in a developer's tree: the checkout's parent folders get traversal (o+x) only.
  d="$PWD"
  while [[ "$d" != / ]]; do chmod o+x "$d" 2>/dev/null || true; d="$(dirname "$d")"; done
fi
exec .venv/bin/python -m pytest -q "$@"
