"""Issue 13: inputs and faults that used to crash, hang or lose data — each front (CLI, HTTP, MCP) holds."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import mcp
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner
from xlaport.kb import SourceError, lint_source
from xlaport.serve.http import create_app
from xlaport.serve.mcp import create_server
from xlaport.serve.pipeline import Pipeline

from xlaport.cli import app

CUDA_SOURCE = "import torch\n\nx = torch.zeros(2).cuda()\n"
AND_CHAIN = "y = " + " and ".join(["x"] * 10_000) + "\n"  # segfaulted libcst's native parser
OR_CHAIN = "y = " + " or ".join(["x"] * 10_000) + "\n"
PLUS_CHAIN = "x = " + "+".join(["1"] * 1_000) + "\n"  # RecursionError in libcst's visitors
STRING_CHAIN = "x = (" + " ".join(['"a"'] * 1_000) + ")\n"  # implicit concatenation nests like a chain


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The real CLI in a child process: a native crash shows as rc -11 / 139, not as a test crash."""
    env = {**os.environ, "USE_TORCH_XLA": "0"}
    return subprocess.run(
        [sys.executable, "-m", "xlaport", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )


def cli_env(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "xlaport", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "USE_TORCH_XLA": "0", **env},
        timeout=300,
    )


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def call_tool(server, name: str, arguments: dict):
    async def go():
        async with mcp.Client(server) as client:
            return await client.call_tool(name, arguments)

    return asyncio.run(go())


# --- 1, 2: pathological nesting is refused with a reason, never a crash ------------------------------------
@pytest.mark.parametrize("source", [AND_CHAIN, OR_CHAIN, PLUS_CHAIN, STRING_CHAIN], ids=["and", "or", "plus", "str"])
def test_pathological_nesting_is_a_source_error(source):
    with pytest.raises(SourceError, match="nested too deeply"):
        lint_source(source)


def test_parse_limits_are_configurable(monkeypatch):
    source = "x = " + "+".join(["1"] * 20) + "\n"
    assert lint_source(source) == []
    monkeypatch.setenv("XLAPORT_MAX_NESTING", "10")
    with pytest.raises(SourceError, match="over 10 levels"):
        lint_source(source)
    monkeypatch.delenv("XLAPORT_MAX_NESTING")
    monkeypatch.setenv("XLAPORT_MAX_NODES", "5")
    with pytest.raises(SourceError, match="too large"):
        lint_source(source)


def test_cli_lint_and_fix_report_the_bad_file_and_fix_the_others(tmp_path: Path):
    (tmp_path / "and.py").write_text(AND_CHAIN)
    (tmp_path / "plus.py").write_text(PLUS_CHAIN)
    (tmp_path / "good.py").write_text(CUDA_SOURCE)
    linted = cli("lint", str(tmp_path))
    assert linted.returncode == 1, linted.stderr[-2000:]
    assert "and.py: cannot parse: nested too deeply" in linted.stderr
    assert "Traceback" not in linted.stderr
    fixed = cli("fix", str(tmp_path))
    assert fixed.returncode == 1 and "Traceback" not in fixed.stderr, fixed.stderr[-2000:]
    assert "plus.py: cannot parse: nested too deeply" in fixed.stderr
    assert "torch_xla" in (tmp_path / "good.py").read_text()  # the good file was still fixed
    assert (tmp_path / "and.py").read_text() == AND_CHAIN


def test_migrate_in_parallel_reports_the_bad_file(tmp_path: Path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "and.py").write_text(AND_CHAIN)
    (src / "good.py").write_text(CUDA_SOURCE)
    (src / "other.py").write_text(CUDA_SOURCE)
    done = cli("migrate", str(src), "--out", str(tmp_path / "out"), "-j", "2")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "and.py: cannot parse: nested too deeply" in done.stderr
    assert (tmp_path / "out" / "and.py").read_text() == AND_CHAIN
    assert "torch_xla" in (tmp_path / "out" / "good.py").read_text()


def test_http_suggest_refuses_deep_nesting_and_keeps_serving():
    with TestClient(create_app(Pipeline(), token=None, warm_up=False)) as c:
        for source in (AND_CHAIN, PLUS_CHAIN):
            refused = c.post("/v1/suggest", json={"source": source, "options": {"k": 0}})
            assert refused.status_code == 422 and "nested too deeply" in str(refused.json()["detail"])
        ok = c.post("/v1/suggest", json={"source": CUDA_SOURCE, "options": {"k": 0}})
        assert ok.status_code == 200 and ok.json()["changed"]


def test_mcp_suggest_refuses_deep_nesting_with_the_reason():
    server = create_server(Pipeline(), allow_execution=False)
    for source in (AND_CHAIN, PLUS_CHAIN):
        result = call_tool(server, "suggest_patch", {"source": source, "k": 0})
        assert result.is_error and "nested too deeply" in result.content[0].text


# --- 3: a FIFO named *.py never hangs a run ------------------------------------------------------------------
def test_fifo_is_skipped_with_a_note(tmp_path: Path):
    os.mkfifo(tmp_path / "pipe.py")
    (tmp_path / "good.py").write_text(CUDA_SOURCE)
    linted = cli("lint", str(tmp_path))  # used to block forever on open()
    assert "pipe.py: not a regular file; skipped" in linted.stderr
    fixed = cli("fix", str(tmp_path))
    assert "pipe.py: not a regular file; skipped" in fixed.stderr and "torch_xla" in (tmp_path / "good.py").read_text()
    out = tmp_path.parent / f"{tmp_path.name}-out"
    migrated = cli("migrate", str(tmp_path), "--out", str(out))
    assert migrated.returncode == 0 and "skipped, not regular files: pipe.py" in migrated.stdout


# --- 4, 5: the way back to every original --------------------------------------------------------------------
def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def make_repo(path: Path, files: dict[str, str]) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q")
    git(path, "config", "user.email", "t@example.com")
    git(path, "config", "user.name", "t")
    for name, text in files.items():
        (path / name).write_text(text)
    git(path, "add", *files)
    git(path, "commit", "-qm", "init")
    return path


def test_fix_backs_up_untracked_and_ignored_files_in_git(tmp_path: Path):
    repo = make_repo(tmp_path / "a", {"tracked.py": CUDA_SOURCE, ".gitignore": "ignored.py\n"})
    (repo / "untracked.py").write_text(CUDA_SOURCE)
    (repo / "ignored.py").write_text(CUDA_SOURCE)
    assert run("fix", str(repo)).exit_code == 0
    assert not (repo / "tracked.py.xlaport.bak").exists()  # git restores it
    for name in ("untracked.py", "ignored.py"):
        assert (repo / f"{name}.xlaport.bak").read_text() == CUDA_SOURCE


def test_each_file_is_judged_in_its_own_repository(tmp_path: Path):
    a = make_repo(tmp_path / "a", {"f.py": CUDA_SOURCE})
    b = make_repo(tmp_path / "b", {"f.py": CUDA_SOURCE})
    (b / "f.py").write_text(CUDA_SOURCE + "y = 1\n")  # dirty in the SECOND repository
    refused = run("fix", str(a / "f.py"), str(b / "f.py"))
    assert refused.exit_code == 2 and str(b / "f.py") in refused.output
    assert (a / "f.py").read_text() == CUDA_SOURCE  # nothing written
    nested = make_repo(a / "inner", {"g.py": CUDA_SOURCE})
    (nested / "g.py").write_text(CUDA_SOURCE + "z = 2\n")
    assert run("fix", str(a)).exit_code == 2  # dirty nested repository
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "h.py").write_text(CUDA_SOURCE)
    assert run("fix", str(a / "f.py"), str(plain / "h.py")).exit_code == 0
    assert (plain / "h.py.xlaport.bak").read_text() == CUDA_SOURCE and not (a / "f.py.xlaport.bak").exists()


def test_migrate_in_place_backs_up_untracked_files(tmp_path: Path):
    repo = make_repo(tmp_path / "a", {"tracked.py": CUDA_SOURCE})
    (repo / "new.py").write_text(CUDA_SOURCE)
    done = cli("migrate", str(repo), "--in-place")
    assert done.returncode == 0, done.stderr[-2000:]
    assert (repo / "new.py.xlaport.bak").read_text() == CUDA_SOURCE
    assert not (repo / "tracked.py.xlaport.bak").exists()


def test_a_second_fix_never_overwrites_the_backup(tmp_path: Path):
    path = tmp_path / "t.py"
    path.write_text(CUDA_SOURCE + "torch.cuda.synchronize()\n")
    original = path.read_text()
    assert run("fix", str(path), "--select", "XLA201").exit_code == 0
    between = path.read_text()
    assert between != original
    assert run("fix", str(path)).exit_code == 0
    assert (tmp_path / "t.py.xlaport.bak").read_text() == original
    assert (tmp_path / "t.py.xlaport.1.bak").read_text() == between


# --- 6, 7, 9: links stay links; owner, group, mode and BOM are kept ----------------------------------------------
def test_fix_writes_through_a_symlink_and_keeps_it(tmp_path: Path):
    target = tmp_path / "real.py"
    target.write_text(CUDA_SOURCE)
    link = tmp_path / "link.py"
    link.symlink_to(target.name)
    assert run("fix", str(link)).exit_code == 0
    assert link.is_symlink() and os.readlink(link) == "real.py"
    assert "torch_xla" in target.read_text()


def test_migrate_copies_symlinks_as_links_and_says_so(tmp_path: Path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "real.py").write_text(CUDA_SOURCE)
    (src / "alias.py").symlink_to("real.py")
    (src / "data").symlink_to("/nonexistent-target")
    done = cli("migrate", str(src), "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr[-2000:]
    out = tmp_path / "out"
    assert (out / "alias.py").is_symlink() and os.readlink(out / "alias.py") == "real.py"
    assert (out / "data").is_symlink()
    assert "symlinks kept as links, not migrated: alias.py, data" in done.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another owner needs root")
def test_fix_keeps_owner_group_and_mode(tmp_path: Path):
    path = tmp_path / "t.py"
    path.write_text(CUDA_SOURCE)
    os.chown(path, 1234, 5678)
    path.chmod(0o640)
    assert run("fix", str(path)).exit_code == 0
    info = path.stat()
    assert (info.st_uid, info.st_gid, info.st_mode & 0o7777) == (1234, 5678, 0o640)
    assert "torch_xla" in path.read_text()


def test_utf8_bom_is_accepted_and_kept(tmp_path: Path):
    path = tmp_path / "bom.py"
    path.write_bytes(b"\xef\xbb\xbf" + CUDA_SOURCE.encode())
    assert run("lint", str(path)).exit_code == 1  # findings, not "cannot parse"
    assert run("fix", str(path)).exit_code == 0
    data = path.read_bytes()
    assert data.startswith(b"\xef\xbb\xbf") and b"torch_xla" in data and data.count(b"\xef\xbb\xbf") == 1
    out = tmp_path / "out"
    src = tmp_path / "src"
    src.mkdir()
    (src / "bom.py").write_bytes(b"\xef\xbb\xbf" + CUDA_SOURCE.encode())
    assert cli("migrate", str(src), "--out", str(out)).returncode == 0
    assert (out / "bom.py").read_bytes().startswith(b"\xef\xbb\xbf")


# --- 8: disk full or an immutable file: a clear error, nothing left behind --------------------------------------
def test_fix_on_a_full_disk_reports_and_leaves_no_temporary(tmp_path: Path, monkeypatch):
    import errno

    path = tmp_path / "t.py"
    path.write_text(CUDA_SOURCE)
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))

    def full(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "replace", full)
    result = run("fix", str(path))
    assert result.exit_code == 1 and "No space left on device" in result.output and "Traceback" not in result.output
    assert path.read_text() == CUDA_SOURCE and synced  # fsynced before the (failed) rename
    # no temporary, and no backup of a rewrite that did not happen (issue 25 F13)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.py"]
    assert "applied 0 fix(es) in 0 file(s)" in result.output  # nothing was written


def test_migrate_on_a_full_disk_removes_the_partial_copy(tmp_path: Path, monkeypatch):
    import errno
    import shutil

    src = tmp_path / "src"
    src.mkdir()
    (src / "a.py").write_text(CUDA_SOURCE)
    (src / "b.txt").write_text("x\n")

    def full(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(shutil, "copyfileobj", full)  # copy_file's byte copy fails as on a full disk
    result = run("migrate", str(src), "--out", str(tmp_path / "out"))
    assert result.exit_code == 1 and "No space left on device" in result.output
    assert not (tmp_path / "out").exists()


def test_files_that_look_like_temporaries_are_the_users(tmp_path: Path):
    """Issue 25 N2: fix deleted every `.NAME.XXXXXXXX.tmp` beside a file it rewrote, and migrate left them out."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.py").write_text(CUDA_SOURCE)
    for name in (".notes.txt.abcd1234.tmp", ".a.py.k3j9x0qa.tmp", ".a.py.k3j9x0qa.xlaport.tmp"):
        (src / name).write_text("precious\n")
    done = cli("migrate", str(src), "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "out" / ".notes.txt.abcd1234.tmp").read_text() == "precious\n"
    assert run("fix", str(src)).exit_code == 0 and "torch_xla" in (src / "a.py").read_text()
    kept = sorted(p.name for p in src.iterdir() if p.name.endswith(".tmp"))
    assert kept == [".a.py.k3j9x0qa.tmp", ".a.py.k3j9x0qa.xlaport.tmp", ".notes.txt.abcd1234.tmp"]


# --- 13: an unknown code is a usage error in --ignore as in --select ------------------------------------------------
@pytest.mark.parametrize("command", ["lint", "fix"])
def test_unknown_ignore_code_is_a_usage_error(tmp_path: Path, command):
    path = tmp_path / "a.py"
    path.write_text(CUDA_SOURCE)
    for option in ("--select", "--ignore"):
        result = run(command, option, "NOPE", str(path))
        assert result.exit_code == 2 and "no rule matches NOPE" in result.output
    assert path.read_text() == CUDA_SOURCE


def test_unknown_ignore_code_is_refused_by_migrate_and_http(tmp_path: Path):
    (tmp_path / "a.py").write_text(CUDA_SOURCE)
    assert run("migrate", str(tmp_path), "--out", str(tmp_path.parent / "o"), "--ignore", "NOPE").exit_code == 2
    with TestClient(create_app(Pipeline(), token=None, warm_up=False)) as c:
        refused = c.post("/v1/suggest", json={"source": CUDA_SOURCE, "options": {"k": 0, "ignore": ["NOPE"]}})
        assert refused.status_code == 422 and "NOPE" in str(refused.json()["detail"])


# --- 11: a timed-out request stops its work and frees its slot -------------------------------------------------
def test_timed_out_suggest_stops_its_work_and_frees_the_slot():
    import time

    heavy = (
        "import torch\n" + "\n".join(f"x{i} = torch.zeros({i}).cuda()" for i in range(8000)) + "\n"
    )  # ~9 s of fixing (262k characters, under the 300k input limit)
    app_ = create_app(Pipeline(), token=None, warm_up=False, timeout_s=3, max_concurrency=1)
    with TestClient(app_) as c:
        start = time.monotonic()
        timed_out = c.post("/v1/suggest", json={"source": heavy, "options": {"k": 0}})
        assert timed_out.status_code == 504, timed_out.text
        # the work was stopped, not left running: the only slot is free again within seconds, not minutes
        ok = c.post("/v1/suggest", json={"source": CUDA_SOURCE, "options": {"k": 0}})
        while ok.status_code == 429 and time.monotonic() - start < 15:
            time.sleep(0.5)
            ok = c.post("/v1/suggest", json={"source": CUDA_SOURCE, "options": {"k": 0}})
        assert ok.status_code == 200 and ok.json()["changed"], ok.text
        assert time.monotonic() - start < 15


# --- issue 25: nothing of the user's lost or exposed -------------------------------------------------------------
def edit_while_analysed(monkeypatch, edited: dict[Path, str]) -> None:
    """Every file in `edited` gets its new text right after fix_file read it (the analysis is then of the old)."""
    from xlaport.kb import batch

    real_fix_file = batch.fix_file

    def fix_file(path, *args, **kwargs):
        result = real_fix_file(path, *args, **kwargs)
        if Path(path) in edited:
            Path(path).write_text(edited[Path(path)])
        return result

    monkeypatch.setattr(batch, "fix_file", fix_file)


def test_fix_never_overwrites_an_edit_made_while_it_analysed(tmp_path: Path, monkeypatch):
    """N4: a file outside git edited during the analysis was overwritten with the fix of its old text."""
    edited, other = tmp_path / "edited.py", tmp_path / "other.py"
    edited.write_text(CUDA_SOURCE)
    other.write_text(CUDA_SOURCE)
    new_text = CUDA_SOURCE + "y = 2  # typed while fix ran\n"
    edit_while_analysed(monkeypatch, {edited: new_text})
    result = run("fix", str(tmp_path))
    assert result.exit_code == 1 and "changed while it was analysed" in result.output, result.output
    assert edited.read_text() == new_text and not (tmp_path / "edited.py.xlaport.bak").exists()
    assert "torch_xla" in other.read_text()  # the others are still fixed
    assert "applied 1 fix(es) in 1 file(s)" in result.output


def test_migrate_in_place_never_overwrites_an_edit_made_while_it_analysed(tmp_path: Path, monkeypatch):
    from xlaport.serve import tree

    src = tmp_path / "src"
    src.mkdir()
    (src / "a.py").write_text(CUDA_SOURCE)
    new_text = CUDA_SOURCE + "y = 2\n"
    real_rewrite = tree.rewrite_files

    def rewrite_then_edit(*args, **kwargs):
        results = real_rewrite(*args, **kwargs)
        (src / "a.py").write_text(new_text)
        return results

    monkeypatch.setattr("xlaport.serve.tree.rewrite_files", rewrite_then_edit)
    done = run("migrate", str(src), "--in-place")
    assert done.exit_code == 0, done.output
    assert (src / "a.py").read_text() == new_text and "changed while it was analysed" in done.output


@pytest.mark.parametrize("flag", ["--skip-worktree", "--assume-unchanged"])
def test_files_git_hides_edits_of_get_a_backup(tmp_path: Path, flag):
    """N5: git status calls a skip-worktree / assume-unchanged file clean even with local edits."""
    repo = make_repo(tmp_path / "a", {"local.py": CUDA_SOURCE})
    git(repo, "update-index", flag, "local.py")
    local_edit = CUDA_SOURCE + "LOCAL = 1\n"
    (repo / "local.py").write_text(local_edit)
    assert run("fix", str(repo)).exit_code == 0
    assert (repo / "local.py.xlaport.bak").read_text() == local_edit
    assert "torch_xla" in (repo / "local.py").read_text()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another owner needs root")
def test_the_backup_belongs_to_the_files_owner_with_its_mode(tmp_path: Path):
    """F10: the backup was root's, 0640, so the file's owner could not read it."""
    path = tmp_path / "t.py"
    path.write_text(CUDA_SOURCE)
    os.chown(path, 1234, 5678)
    path.chmod(0o640)
    assert run("fix", str(path)).exit_code == 0
    info = (tmp_path / "t.py.xlaport.bak").stat()
    assert (info.st_uid, info.st_gid, info.st_mode & 0o7777) == (1234, 5678, 0o640)


def test_reports_are_no_more_readable_than_the_sources_they_quote(tmp_path: Path):
    """N6: reports were 0644 and quoted a 0600 source."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "open.py").write_text(CUDA_SOURCE)
    (src / "private.py").write_text(CUDA_SOURCE)
    (src / "private.py").chmod(0o600)
    traces = tmp_path / "traces.jsonl"
    done = cli_env(
        "migrate", str(src), "--out", str(tmp_path / "out"), "--keep-trace", env={"XLAPORT_TRACES": str(traces)}
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = tmp_path / "out"
    quoting = [out / n for n in ("xlaport-report.json", "xlaport-report.md", "xlaport-report.html")]
    for path in [*quoting, out / "xlaport-trace.jsonl", traces]:
        assert path.stat().st_mode & 0o777 == 0o600, path
    (src / "private.py").unlink()
    again = cli_env("migrate", str(src), "--out", str(tmp_path / "out2"), env={"XLAPORT_TRACES": str(tmp_path / "t2")})
    assert again.returncode == 0 and (tmp_path / "out2" / "xlaport-report.html").stat().st_mode & 0o777 == 0o644


def test_a_file_reached_twice_is_fixed_once(tmp_path: Path):
    """F13/N11: a symlink beside its target, or a path given twice, was processed (and counted) twice."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "real.py").write_text(CUDA_SOURCE)
    (tree / "alias.py").symlink_to("real.py")
    result = run("fix", str(tree), str(tree / "real.py"))
    assert result.exit_code == 0, result.output
    assert "applied 1 fix(es) in 1 file(s)" in result.output
    assert (tree / "alias.py").is_symlink() and (tree / "real.py").read_text().count("torch_xla.device()") == 1
    assert sorted(p.name for p in tree.iterdir()) == ["alias.py", "real.py", "real.py.xlaport.bak"]


def test_summary_counts_only_fixes_really_written(tmp_path: Path, monkeypatch):
    import errno

    (tmp_path / "a.py").write_text(CUDA_SOURCE)
    (tmp_path / "b.py").write_text(CUDA_SOURCE)
    real_replace = os.replace

    def fail_for_b(source, target, *args, **kwargs):
        if Path(target).name == "b.py":
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return real_replace(source, target, *args, **kwargs)

    monkeypatch.setattr(os, "replace", fail_for_b)
    result = run("fix", str(tmp_path))
    assert result.exit_code == 1 and "applied 1 fix(es) in 1 file(s)" in result.output, result.output
    assert not (tmp_path / "b.py.xlaport.bak").exists() and (tmp_path / "a.py.xlaport.bak").exists()


def test_fix_of_a_folder_never_writes_outside_it_through_a_link(tmp_path: Path):
    """N18: `fix DIR` rewrote files outside DIR that a link inside it pointed at."""
    outside = tmp_path / "outside.py"
    outside.write_text(CUDA_SOURCE)
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "link.py").symlink_to(outside)
    (tree / "own.py").write_text(CUDA_SOURCE)
    result = run("fix", str(tree))
    assert result.exit_code == 0, result.output
    assert outside.read_text() == CUDA_SOURCE and not (tmp_path / "outside.py.xlaport.bak").exists()
    assert "link.py: a link to a file outside the folder given; not rewritten" in result.output
    assert "torch_xla" in (tree / "own.py").read_text()
    assert run("fix", str(tree / "link.py")).exit_code == 0  # named by the user: followed, as before
    assert "torch_xla" in outside.read_text()


def test_sarif_uris_are_percent_encoded_and_unparsable_files_are_notifications(tmp_path: Path):
    """N17: a file URI with a space or `#` was written as it is; an unparsable file was missing from the log."""
    import json

    folder = tmp_path / "my project#1"
    folder.mkdir()
    (folder / "train 100%.py").write_text(CUDA_SOURCE)
    (folder / "broken.py").write_text("def f(:\n")
    result = run("lint", "--format", "sarif", str(folder))
    assert result.exit_code == 1
    log = json.loads(result.stdout)
    run_ = log["runs"][0]
    uris = {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in run_["results"]}
    assert uris == {(folder / "train 100%.py").as_uri()} and "my%20project%231/train%20100%25.py" in uris.pop()
    invocation = run_["invocations"][0]
    assert invocation["executionSuccessful"] is False
    [notification] = invocation["toolExecutionNotifications"]
    assert notification["level"] == "error" and "cannot parse" in notification["message"]["text"]
    uri = notification["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
    assert uri == (folder / "broken.py").as_uri()


@pytest.mark.parametrize(
    "source",
    [
        "type Vector = list[float]\n",
        "def first[T](items: list[T]) -> T:\n    return items[0]\n",
        'config = {"lr": 1}\nprint(f"{config["lr"]}")\n',
    ],
    ids=["type-alias", "generic-def", "nested-fstring-quotes"],
)
def test_newer_python_syntax_is_not_the_users_syntax_error(source):
    """N10: valid Python 3.12 syntax (which libcst parses) was reported as the user's syntax error."""
    if sys.version_info >= (3, 12):
        pytest.skip("this interpreter parses 3.12 syntax")
    with pytest.raises(SourceError) as refused:
        lint_source(source)
    assert "newer than the Python 3.11" in str(refused.value) and "not an error in the file" in str(refused.value)
    with pytest.raises(SourceError, match="cannot parse: SyntaxError"):
        lint_source("def f(:\n")  # a real syntax error is still one
    with pytest.raises(SourceError, match="cannot parse"):  # a shape unsafe for libcst is never handed to it
        lint_source("y = " + " and ".join(["x"] * 10_000) + " +\n")


def test_confined_writes_refuse_outside_and_allow_a_staging_folder(tmp_path: Path):
    from xlaport.files import WriteFailed, atomic_write, writable_too, writes_confined_to

    root, stage = tmp_path / "root", tmp_path / "stage"
    root.mkdir()
    stage.mkdir()
    with writes_confined_to(root):
        atomic_write(root / "ok.txt", "x\n")
        with pytest.raises(WriteFailed, match="outside the allowed folder"):
            atomic_write(stage / "a.txt", "x\n")
        with writable_too(stage):
            atomic_write(stage / "a.txt", "x\n")
        with pytest.raises(WriteFailed):
            atomic_write(stage / "b.txt", "x\n")
    atomic_write(stage / "b.txt", "x\n")  # not confined outside the block
    assert sorted(p.name for p in stage.iterdir()) == ["a.txt", "b.txt"]


def test_a_huge_file_is_refused_before_it_is_read(tmp_path: Path):
    """A 3 GB file (sparse: no disk used) in a tree, under a 1.5 GB address-space limit: read whole it would kill
    the run; refused by its size it costs nothing, and the other files are still linted."""
    import resource

    from xlaport.serve.mcp import _read_text
    from xlaport.serve.project import ProjectError

    (tmp_path / "good.py").write_text(CUDA_SOURCE)
    with open(tmp_path / "huge.py", "wb") as handle:
        handle.truncate(3 * 2**30)

    def limit_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1_500_000_000, 1_500_000_000))

    linted = subprocess.run(
        [sys.executable, "-m", "xlaport", "lint", str(tmp_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "USE_TORCH_XLA": "0"},
        timeout=300,
        preexec_fn=limit_memory,
    )
    assert linted.returncode == 1, linted.stderr[-2000:]
    assert "huge.py: too large to analyse: 3,221,225,472 bytes" in linted.stderr
    assert "good.py:3:" in linted.stdout  # the other file was linted
    tmp_path.chmod(0o755)  # the sandbox user may read the folder: the size, not the mode, refuses the file
    with pytest.raises(ProjectError, match="too large to analyse"):
        _read_text(tmp_path / "huge.py", tmp_path)  # MCP suggest_patch(project_root, path)
