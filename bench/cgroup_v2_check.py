"""The sandbox's cgroup limits on this machine, for real: what the probe chose (v1, v2, or polling, and why), then
three runs through `run_sandboxed`: 700 MB under a 256 MB limit (killed), 100 MB under it (runs), and 300 forks
under a 40-task limit (capped). Run as root; on a cgroup v2 host, start it as the only process of a group with the
memory and pids controllers available (what `xlaport` is in a service or a container of its own), e.g.:

    mkdir /sys/fs/cgroup/xlaport-svc
    sh -c 'echo $$ > /sys/fs/cgroup/xlaport-svc/cgroup.procs && exec python bench/cgroup_v2_check.py'

Prints one JSON object (issue 25 round 3b, item 4; results in bench/results/security_campaign_2026-12-04b.txt).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from xlaport.eval.sandbox import run_sandboxed, sandbox_status

FORKS = (
    "import os, time\n"
    "print(open('/proc/self/cgroup').read().strip())\n"
    "n = 0\n"
    "try:\n"
    "    for _ in range(300):\n"
    "        if os.fork() == 0:\n"
    "            time.sleep(3)\n"
    "            os._exit(0)\n"
    "        n += 1\n"
    "except OSError as error:\n"
    "    print('fork refused:', error)\n"
    "print('forks', n)\n"
)


def main() -> None:
    mechanisms = sandbox_status()
    python = sys.executable
    too_much = run_sandboxed([python, "-c", "b = bytearray(700 << 20)\nprint(len(b))"], timeout_s=60, memory_mb=256)
    fits = run_sandboxed([python, "-c", "b = bytearray(100 << 20)\nprint(len(b))"], timeout_s=60, memory_mb=256)
    forks = run_sandboxed([python, "-c", FORKS], timeout_s=60, max_tasks=40)
    report = {
        "cgroup": Path("/proc/self/cgroup").read_text().strip(),
        "cgroup_version": mechanisms.cgroup_version,
        "memory_cgroup": mechanisms.memory_cgroup,
        "refused": list(mechanisms.refused),
        "700MB_under_256MB": {"kill_reason": too_much.kill_reason, "peak_mb": round(too_much.peak_rss_mb)},
        "100MB_under_256MB": {"returncode": fits.returncode, "peak_mb": round(fits.peak_rss_mb)},
        "300_forks_under_40_tasks": {"stdout": forks.stdout.strip().splitlines(), "survivors": forks.survivors},
        "guarantees": forks.guarantees,
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
