#!/usr/bin/env bash
# The main job on the bundled example: migrate examples/ into a new folder and print the summary.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
out="${1:-migrated/examples-$(date +%Y%m%d-%H%M%S)}"
export USE_TORCH_XLA=0
.venv/bin/xlaport migrate examples --out "$out"
echo "migrated copy written to: $out"
