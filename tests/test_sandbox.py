"""Hostile scripts against the sandbox (eval/sandbox/): real processes, real cgroups and namespaces.

Each test asserts its guarantee as far as this machine allows and skips, naming the refused mechanism,
where it does not (`sandbox_status().refused`)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner
from xlaport.eval.check import check_source
from xlaport.eval.sandbox import host_memory_mb, run_sandboxed, sandbox_status
from xlaport.eval.sandbox.mechanisms import own_cgroup

from xlaport.cli import app

MECH = sandbox_status()
needs_cgroups = pytest.mark.skipif(
    not (MECH.memory_cgroup and MECH.pids_cgroup), reason="cgroup v1 memory/pids not writable here"
)
needs_namespaces = pytest.mark.skipif(not MECH.namespaces, reason="`unshare` refused: no PID/network namespace")
needs_user = pytest.mark.skipif(MECH.user is None, reason="not root: no unprivileged user to drop to")


def alive_with(marker: str) -> list[int]:
    """Host PIDs whose command line contains `marker` (this test process excluded)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if marker.encode() in cmdline and state != "Z":
                found.append(int(entry))
    return found


def python(code: str, **kwargs):
    return run_sandboxed([sys.executable, "-c", code], **kwargs)


def test_status_names_every_refused_mechanism():
    status = MECH.to_dict()
    assert status["sandboxed"] == (not status["refused"])
    assert any("environment" in line for line in status["guarantees"])


def test_exit_code_and_signal_pass_through():
    assert python("raise SystemExit(3)").returncode == 3
    assert python("import os, signal; os.kill(os.getpid(), signal.SIGTERM)").returncode == -15


@needs_cgroups
def test_detached_daemon_over_the_memory_limit_is_killed_and_reported():
    marker = f"xlaport-daemon-{uuid.uuid4().hex}"
    daemon = f"b = bytearray(600 * 2**20); b[::4096] = b'x' * len(b[::4096]); import time; time.sleep(3600)  # {marker}"
    code = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {daemon!r}], start_new_session=True)\n"
        "time.sleep(30)\n"
    )
    result = python(code, memory_mb=256, timeout_s=60)
    assert result.memory_exceeded and result.kill_reason == "memory"
    assert 200 <= result.peak_rss_mb <= 300, result.peak_rss_mb
    assert result.wall_s < 20
    assert result.survivors == [] and alive_with(marker) == []


@needs_cgroups
def test_daemons_die_when_the_command_ends():
    marker = f"3600.{uuid.uuid4().int % 10**9}"  # a unique `sleep` argument
    code = (
        "import os, subprocess\n"
        f"subprocess.Popen(['sleep', '{marker}'], start_new_session=True)\n"
        "if os.fork() == 0:\n"  # the classic double fork into a new session
        "    os.setsid()\n"
        f"    os.execvp('sleep', ['sleep', '{marker}'])\n"
    )
    result = python(code, timeout_s=30)
    assert result.returncode == 0 and not result.timed_out
    assert result.wall_s < 10
    assert result.survivors == [] and alive_with(marker) == []


def test_a_child_keeping_stdout_does_not_stretch_the_timeout():
    code = "import subprocess, time\nsubprocess.Popen(['sleep', 'infinity'])\ntime.sleep(3600)\n"
    result = python(code, timeout_s=3)
    assert result.timed_out
    assert result.wall_s < 8, result.wall_s


@pytest.mark.skipif(not (MECH.namespaces or MECH.memory_cgroup), reason="no cgroup and no PID namespace here")
def test_check_cli_timeout_holds_with_sleep_infinity(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text("import subprocess, time\nsubprocess.Popen(['sleep', 'infinity'])\ntime.sleep(3600)\n")
    start = time.monotonic()
    result = CliRunner().invoke(app, ["check", str(script), "--timeout", "4"])
    assert result.exit_code == 1
    assert "timed out" in result.output
    assert time.monotonic() - start < 10


def test_server_secrets_do_not_reach_the_child(monkeypatch):
    monkeypatch.setenv("XLAPORT_TOKEN", "secret-token-123")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-aws-456")
    report = check_source("import os\nprint(sorted(os.environ.items()))\n")
    assert report.exit_code == 0, report.error
    assert "secret-token-123" not in report.stdout_tail and "secret-aws-456" not in report.stdout_tail
    assert "PJRT_DEVICE" in report.stdout_tail  # what the check needs still arrives


@needs_user
def test_runs_as_nobody_and_cannot_write_outside_its_folders(tmp_path):
    outside = Path("/var/lib/xlaport-sandbox-test")  # root-owned, 0755, outside every handed-over folder
    outside.mkdir(exist_ok=True)
    try:
        code = (
            "import os\n"
            "print(os.getuid())\n"
            "open('mine.txt', 'w').write('ok')\n"
            f"for path in ['{outside}/x', '/work/x', '/etc/x']:\n"
            "    try:\n"
            "        open(path, 'w')\n"
            "        print('WROTE', path)\n"
            "    except OSError as error:\n"
            "        print('refused', error.errno)\n"
        )
        report = check_source(code)
        assert report.exit_code == 0, report.error
        lines = report.stdout_tail.splitlines()
        assert lines[0] == str(MECH.user[0])
        assert lines[1:] == ["refused 13"] * 3
        assert not any(outside.iterdir())
    finally:
        for child in outside.iterdir():
            child.unlink()
        outside.rmdir()


@needs_namespaces
def test_tmp_is_private():
    marker = f"xlaport-tmp-{uuid.uuid4().hex}"
    result = python(f"open('/tmp/{marker}', 'w').write('x'); import os; print(os.listdir('/tmp'))")
    assert result.returncode == 0, result.stderr
    assert not Path("/tmp", marker).exists()
    assert marker in result.stdout


@needs_namespaces
def test_no_network_to_the_server_on_loopback():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        code = f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=3)\n    print('CONNECTED')\nexcept OSError as error:\n    print('refused', error)\n"
        result = python(code, timeout_s=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("refused"), result.stdout


@needs_cgroups
def test_fork_bomb_is_contained():
    marker = f"xlaport-bomb-{uuid.uuid4().hex}"
    code = f"# {marker}\nimport os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    result = python(code, timeout_s=4, max_tasks=64)
    assert result.timed_out
    assert result.wall_s < 15
    assert result.survivors == [] and alive_with(marker) == []


def test_peak_memory_is_reported():
    code = "import time\nb = bytearray(300 * 2**20)\nb[::4096] = b'x' * len(b[::4096])\ntime.sleep(1)\n"
    result = python(code, memory_mb=1024)
    assert result.ok, result.stderr
    assert 300 <= result.peak_rss_mb <= 450, result.peak_rss_mb


def test_memory_above_the_host_is_refused_or_clamped(tmp_path):
    too_much = host_memory_mb() + 1024
    assert python("pass", memory_mb=too_much).memory_limit_mb == host_memory_mb()  # a library default: clamped
    report = check_source("pass\n", memory_mb=too_much)
    assert report.memory_limit_mb == host_memory_mb() and any("memory limit lowered" in n for n in report.notes)
    script = tmp_path / "s.py"
    script.write_text("pass\n")
    result = CliRunner().invoke(app, ["check", str(script), "--memory-mb", str(too_much)])
    assert result.exit_code == 2
    assert "more than this machine has" in result.output


def test_handed_over_folder_receives_results(tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    result = python(f"open('{scratch}/result.txt', 'w').write('done')", writable=[scratch])
    assert result.returncode == 0, result.stderr
    assert (scratch / "result.txt").read_text() == "done"


def test_without_any_mechanism_the_run_works_and_is_not_called_sandboxed(monkeypatch):
    from xlaport.eval.sandbox import Mechanisms, run

    bare = Mechanisms(None, None, False, None, ("everything refused (test)",))
    monkeypatch.setattr(run, "sandbox_status", lambda: bare)
    result = python("import os, time\nprint(os.getpid() > 2)\nos.fork()\ntime.sleep(3600)\n", timeout_s=3)
    assert result.timed_out and result.stdout.strip().startswith("True")
    assert not result.sandboxed and result.gaps == ["everything refused (test)"]
    assert result.survivors == []  # the process group and its children were tracked and killed
    assert not any("nobody" in g for g in result.guarantees)


@needs_user
def test_a_workdir_nobody_cannot_use_keeps_the_user_and_says_so(tmp_path):
    workdir = tmp_path / "private"
    workdir.mkdir(mode=0o700)
    report = check_source("import os\nprint(os.getuid())\n", workdir=workdir)
    assert report.exit_code == 0, report.error
    assert report.stdout_tail == "0"
    assert any(note.startswith("not sandboxed: runs as root") for note in report.notes), report.notes


def test_a_fifo_or_a_link_left_where_the_parent_reads_is_not_followed():
    # the child owns its scratch folder: it can swap the files xlaport reads afterwards
    code = (
        "import os\n"
        "events = os.environ['XLAPORT_CHECK_OUT']\n"
        "os.path.exists(events) and os.remove(events)\n"
        "os.mkfifo(events)\n"  # a plain read would never end
        "os.symlink('/etc/shadow', os.environ['PT_XLA_DEBUG_FILE'])\n"
    )
    reports = []
    worker = threading.Thread(target=lambda: reports.append(check_source(code)), daemon=True)
    worker.start()
    worker.join(120)
    assert not worker.is_alive(), "the check hung reading what the child left"
    assert reports[0].exit_code == 0, reports[0].error


def test_http_healthz_states_the_sandbox_and_check_keeps_the_token_away(monkeypatch):
    from fastapi.testclient import TestClient
    from xlaport.serve.http import create_app
    from xlaport.serve.pipeline import Pipeline

    token = "server-token-789"
    monkeypatch.setenv("XLAPORT_TOKEN", token)  # as the server is started
    with TestClient(create_app(Pipeline(), token=token, warm_up=False)) as client:
        health = client.get("/healthz").json()
        assert health["sandbox"] == MECH.to_dict()
        auth = {"Authorization": f"Bearer {token}"}
        body = {"source": "import os\nprint(dict(os.environ))\n", "timeout_s": 60, "memory_mb": 1024}
        answer = client.post("/v1/check", json=body, headers=auth)
        assert answer.status_code == 200, answer.text
        report = answer.json()["check"]["report"]
        assert token not in answer.text and "PJRT_DEVICE" in report["stdout_tail"]
        assert MECH.sandboxed == (not any(note.startswith("not sandboxed") for note in report["notes"]))
        too_much = client.post("/v1/check", json={**body, "memory_mb": 65536}, headers=auth)
        if host_memory_mb() < 65536:
            assert too_much.status_code == 422 and "more than this machine has" in too_much.text


@pytest.mark.skipif(not (MECH.namespaces or MECH.memory_cgroup), reason="no cgroup and no PID namespace here")
def test_a_killed_xlaport_leaves_no_run_behind():
    suffix = str(uuid.uuid4().int % 10**9)
    marker = f"3600.{suffix}"  # only the sandboxed sleeps carry it whole: the parent gets the suffix
    parent = (
        "import sys\n"
        "from xlaport.eval.sandbox import run_sandboxed\n"
        "marker = '3600.' + sys.argv[1]\n"
        "run_sandboxed(['sh', '-c', f'sleep {marker} & sleep {marker}'], timeout_s=600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", parent, suffix])
    deadline = time.monotonic() + 60
    while not alive_with(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert alive_with(marker), "the sandboxed command did not start"
    proc.kill()  # xlaport itself dies mid-run: SIGKILL, no clean-up code runs
    proc.wait()
    deadline = time.monotonic() + 10
    while alive_with(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert alive_with(marker) == []
    if MECH.memory_cgroup:  # its empty cgroup is removed by the next probe, once the kernel has emptied it
        deadline = time.monotonic() + 10  # killed tasks leave a cgroup a moment after they are gone (rmdir: EBUSY)
        while True:
            own_cgroup("memory")
            left = list(Path(MECH.memory_cgroup).glob(f"xlaport-{proc.pid}-*"))
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert not left
