#!/usr/bin/env bash
# The main job on the bundled examples: migrate each project into a new folder, validate the migrated
# copy (XLA execution check + generated differential tests) and verify it against a reference run of
# the original (L0–L4). Prints each summary and where the results are.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
out="${1:-migrated/examples-$(date +%Y%m%d-%H%M%S)}"
steps="${XLAPORT_EXAMPLE_STEPS:-60}"
export PJRT_DEVICE="${PJRT_DEVICE:-CPU}"
status=0
for project in examples/*/; do
  name="$(basename "$project")"
  echo "=== $name"
  .venv/bin/xlaport migrate "$project" --out "$out/$name" --unsafe-fixes \
    --validate "python train.py --steps $steps" \
    --verify "python train.py --steps $steps" || status=1
done
echo
echo "migrated copies and reports (xlaport-report.html, xlaport-verify.html) in: $out"
exit $status
