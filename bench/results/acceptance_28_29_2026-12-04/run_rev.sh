#!/usr/bin/env bash
# usage: run_rev.sh REV  -> /tmp/audit29/rev-REV.json
set -euo pipefail
rev=$1
rm -rf /tmp/audit-rev && mkdir /tmp/audit-rev
git -C /work/wt-audit archive "$rev" | tar -x -C /tmp/audit-rev
[[ -x /tmp/audit-rev-venv/bin/python ]] || { python3.11 -m venv /tmp/audit-rev-venv; echo /work/main/.venv/lib/python3.11/site-packages > /tmp/audit-rev-venv/lib/python3.11/site-packages/zz_main.pth; }
/tmp/audit-rev-venv/bin/pip install -q --no-deps -e /tmp/audit-rev 2>&1 | grep -v "WARNING\|ignored" | tail -2 || true
cd /tmp/audit29 && PJRT_DEVICE=CPU /tmp/audit-rev-venv/bin/python /tmp/audit29/rev_outputs.py /tmp/audit29/rev-$rev.json
