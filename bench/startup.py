"""Start-up of the integrators' fronts (issue 31 item 2): a stdio `xlaport mcp` until `initialize` is answered (wall,
and the server's CPU seconds then, from /proc), and one `xlaport kb search` (wall, CPU of the child), 3 times each.

    .venv/bin/python bench/startup.py

On a loaded machine wall time is CPU time stretched by the load; the CPU figures are what an idle machine waits.
"""

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

exe = Path(sys.executable).with_name("xlaport")


def mcp_ready():
    t = time.perf_counter()
    p = subprocess.Popen(
        [str(exe), "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    info = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
    p.stdin.write(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": info}) + "\n")
    p.stdin.flush()
    p.stdout.readline()
    wall = time.perf_counter() - t
    fields = open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    wall = (round(wall, 2), round(cpu, 2))
    p.stdin.close()
    p.wait(120)
    return wall


def kb_search():
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(
        [str(exe), "kb", "search", "RuntimeError: Found no NVIDIA driver on your system"],
        capture_output=True,
        check=True,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.perf_counter() - t, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


print("load", os.getloadavg())
print("mcp initialize (wall, cpu of the server) s:", [mcp_ready() for _ in range(3)])
print("kb search (wall, cpu) s:", [tuple(round(x, 2) for x in kb_search()) for _ in range(3)])
