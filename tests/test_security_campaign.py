"""Issue 25, the campaign rerun: variants of the listed repros that an attacker or an unlucky user would try
(paths that leave a project's copy, a file swapped for a link between a check and the read), each through the
front that exposed it (MCP tools through the SDK's client, HTTP through the ASGI app)."""

import asyncio
import json
import os
from pathlib import Path

import mcp
import pytest
from fastapi.testclient import TestClient
from xlaport.serve.http import create_app
from xlaport.serve.mcp import create_server
from xlaport.serve.pipeline import Pipeline

TOKEN = "campaign-s3cret"
CUDA = "import torch\n\nx = torch.zeros(2).cuda()\nprint(x)\n"


def call(server, name: str, arguments: dict):
    async def go():
        async with mcp.Client(server) as client:
            return await client.call_tool(name, arguments)

    return asyncio.run(go())


def error_of(result) -> dict:
    assert result.is_error, result.content
    text = result.content[0].text
    return json.loads(text[text.index("{") :])


def project_and_outside(tmp_path: Path) -> tuple[Path, Path]:
    """A server root holding a project with a link to a folder outside the root, and that outside folder."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "proj").mkdir(parents=True)
    outside.mkdir()
    (root / "proj" / "train.py").write_text("print('hi')\n")
    (root / "proj" / "data").symlink_to(outside)  # e.g. a dataset folder linked in
    return root, outside


ESCAPES = ["{outside}/planted.py", "../../../../../../../../{outside}/planted.py", "data/planted.py"]


@pytest.mark.parametrize("escape", ESCAPES)
def test_check_xla_never_writes_the_script_outside_the_projects_copy(tmp_path, escape):
    """check_xla with project_root wrote `source` at `path` in the copy: an absolute path, `..` or a link the project
    holds put it anywhere the server (root) may write, with execution allowed and writes not."""
    root, outside = project_and_outside(tmp_path)
    server = create_server(Pipeline(), allow_execution=True, allow_writes=False, root=root)
    path = escape.format(outside=outside)
    result = call(server, "check_xla", {"source": "print(1)\n", "project_root": "proj", "path": path, "timeout_s": 60})
    assert error_of(result)["code"] == "bad_project", path
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("escape", ESCAPES)
def test_suggest_patch_validation_never_writes_outside_the_projects_copy(tmp_path, escape):
    root, outside = project_and_outside(tmp_path)
    server = create_server(Pipeline(), allow_execution=True, allow_writes=False, root=root)
    path = escape.format(outside=outside)
    arguments = {"source": CUDA, "project_root": "proj", "path": path, "validate": True, "timeout_s": 60, "k": 0}
    result = call(server, "suggest_patch", arguments)
    assert error_of(result)["code"] == "bad_project", path
    assert list(outside.iterdir()) == []


def test_http_check_and_suggest_never_write_outside_the_projects_copy(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    project = {"files": {"train.py": "print('hi')\n"}}
    with TestClient(create_app(Pipeline(), token=TOKEN, warm_up=False)) as client:
        for path in (f"{outside}/planted.py", f"../../../../../../../{outside}/planted.py"):
            check = {"source": "print(1)\n", "project": project, "path": path, "timeout_s": 60}
            response = client.post("/v1/check", json=check, headers=auth)
            assert response.status_code == 422, (path, response.text)
            options = {"validate_patch": True, "k": 0, "timeout_s": 60}
            suggest = {"source": CUDA, "project": project, "path": path, "options": options}
            response = client.post("/v1/suggest", json=suggest, headers=auth)
            assert response.status_code == 422, (path, response.text)
    assert list(outside.iterdir()) == []


SECRET_TEXT = "root:$6$not-for-you:19000:0:99999:7:::\n"


def secret_outside(tmp_path: Path) -> Path:
    secret = tmp_path / "shadow"
    secret.write_text(SECRET_TEXT)
    secret.chmod(0o600)
    return secret


def test_a_file_swapped_for_a_link_after_the_check_is_not_read(tmp_path):
    from xlaport.files import NotInside, read_bytes_inside

    secret = secret_outside(tmp_path)
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "train.py").write_text("print('mine')\n")
    assert read_bytes_inside(root / "sub" / "train.py", root) == b"print('mine')\n"
    (root / "sub" / "train.py").unlink()
    (root / "sub" / "train.py").symlink_to(secret)  # the file itself swapped
    with pytest.raises(NotInside):
        read_bytes_inside(root / "sub" / "train.py", root)
    (root / "sub").rename(root / "old")
    (root / "sub").symlink_to(tmp_path)  # a folder above it swapped
    (tmp_path / "train.py").write_text("print('theirs')\n")
    with pytest.raises(NotInside):
        read_bytes_inside(root / "sub" / "train.py", root)


def test_suggest_patch_reads_the_file_it_checked_not_a_link_swapped_in(tmp_path, monkeypatch):
    """TOCTOU: suggest_patch checked project_root/path inside the root, then read whatever the path was then."""
    from xlaport.serve import mcp as mcp_front

    secret = secret_outside(tmp_path)
    root = tmp_path / "root"
    (root / "proj").mkdir(parents=True)
    script = root / "proj" / "train.py"
    script.write_text(CUDA)
    checked = mcp_front.Access.path

    def check_then_swap(self, given):
        resolved = checked(self, given)
        if resolved == script:  # the user swaps the file for a link once the server has checked it
            script.unlink()
            script.symlink_to(secret)
        return resolved

    monkeypatch.setattr(mcp_front.Access, "path", check_then_swap)
    server = create_server(Pipeline(), allow_execution=False, allow_writes=False, root=root)
    result = call(server, "suggest_patch", {"project_root": "proj", "path": "train.py", "k": 0})
    assert error_of(result)["code"] == "bad_project"
    assert "not-for-you" not in result.content[0].text


def test_a_projects_copy_never_follows_a_file_swapped_for_a_link(tmp_path, monkeypatch):
    """The copy a run sees (readable to the sandbox user) checked each entry for a link, then copied by path: a
    file swapped for a link in between was copied from the link's target, a root-only file included."""
    from xlaport.serve.project import ProjectError, local_project

    secret = secret_outside(tmp_path)
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").symlink_to(secret)
    monkeypatch.setattr(Path, "is_symlink", lambda self: False)  # what the check saw, before the swap
    with pytest.raises(ProjectError):
        local_project(project).write_to(tmp_path / "copy")
    monkeypatch.undo()
    copied = tmp_path / "copy" / "train.py"
    assert not copied.exists() or "not-for-you" not in copied.read_text()


def test_a_project_path_with_a_nul_or_a_long_name_is_refused(tmp_path):
    root, outside = project_and_outside(tmp_path)
    server = create_server(Pipeline(), allow_execution=True, allow_writes=False, root=root)
    for path in ("a\0b.py", "x" * 300 + ".py"):
        result = call(server, "check_xla", {"source": "print(1)\n", "project_root": "proj", "path": path})
        assert error_of(result)["code"] in ("bad_input", "bad_project"), path
    assert os.listdir(outside) == []


LOGGING_LOOP = (
    "import torch\nimport torch_xla\n\nw = torch.zeros(2, device=torch_xla.device())\n"
    "for step in range(3):\n    loss = (w + 1).sum()\n    print('loss', loss.item())\n    torch_xla.sync()\n"
)


def test_optimize_reports_are_no_more_readable_than_the_sources_they_quote(tmp_path):
    """N6 for the optimization report: xlaport-optimize.json/.md quote each candidate's diff and were written 0644
    beside a 0600 source."""
    from xlaport.serve.optimize import REPORT_JSON, REPORT_MD, optimize

    tree = tmp_path / "migrated"
    tree.mkdir()
    (tree / "train.py").write_text(LOGGING_LOOP)
    (tree / "train.py").chmod(0o600)
    report = optimize(tree, None, write=True)
    assert report.candidates, "the fixture should give the report a diff to quote"
    for name in (REPORT_JSON, REPORT_MD):
        assert (tree / name).stat().st_mode & 0o077 == 0, name


def test_optimize_never_overwrites_an_edit_made_while_it_ran(tmp_path):
    """N4 for the optimization: a kept candidate was written over whatever the file held by then (its runs take
    minutes), so an edit made meanwhile was lost; now the file is left as it is and the report says so."""
    from xlaport.serve.optimize import OptimizeReport, Session, _write

    tree = tmp_path / "migrated"
    tree.mkdir()
    (tree / "train.py").write_text(LOGGING_LOOP)
    session = Session(tree, None, scratch=tmp_path / "scratch")
    session.texts["train.py"] = LOGGING_LOOP.replace("print('loss', loss.item())", "pass")  # a kept candidate
    (tree / "train.py").write_text(LOGGING_LOOP + "# the user's edit, made during the runs\n")
    report = OptimizeReport(str(tree), None, None, None, "optimized")
    _write(session, report)
    assert (tree / "train.py").read_text().endswith("# the user's edit, made during the runs\n")
    assert report.written == [] and any("changed while" in note for note in report.notes)


def test_a_confined_migration_reads_no_source_outside_its_root(tmp_path):
    """migrate_repo lists the tree (links are copied as links, never read), then reads each file by its path: a file
    swapped for a link to a root-only file in between was read, migrated and written into the root. Within a
    confined call, a source is read only when the file opened lies inside the root."""
    from xlaport.files import UnreadableSource, read_source, writes_confined_to

    secret = secret_outside(tmp_path)
    root = tmp_path / "root"
    root.mkdir()
    (root / "train.py").write_text(CUDA)
    with writes_confined_to(root):
        assert read_source(root / "train.py") == CUDA
        (root / "train.py").unlink()
        (root / "train.py").symlink_to(secret)  # swapped after the listing
        with pytest.raises(UnreadableSource, match="outside the allowed folder"):
            read_source(root / "train.py")
    assert read_source(root / "train.py") == SECRET_TEXT  # unconfined (the CLI on the user's own files): followed


def test_copies_handed_to_the_sandbox_user_never_follow_a_file_swapped_for_a_link(tmp_path):
    """verify's, optimize's and testgen's copies of a tree (handed to the sandbox user, chown included) were made with
    copytree + copy2: a file swapped for a link after copytree listed it was copied from the link's target, so a
    root-only file became the sandbox user's. Each file is now copied as it is opened."""
    from xlaport.eval.verify.runs import copy_tree

    from xlaport.files import NotInside, copier_inside

    secret = secret_outside(tmp_path)
    top = tmp_path / "tree"
    (top / "sub").mkdir(parents=True)
    (top / "train.py").symlink_to(secret)  # what the listing saw as a file, swapped before the copy
    (tmp_path / "copy").mkdir()
    copier_inside(top)(str(top / "train.py"), str(tmp_path / "copy" / "train.py"))
    assert (tmp_path / "copy" / "train.py").is_symlink()  # copied as the link it is, its target not read
    (top / "sub").rmdir()
    (top / "sub").symlink_to(secret.parent)  # a folder swapped for a link out of the tree
    with pytest.raises(NotInside):
        copier_inside(top)(str(top / "sub" / "shadow"), str(tmp_path / "copy" / "shadow"))
    assert not (tmp_path / "copy" / "shadow").exists()
    (top / "train.py").unlink()
    (top / "train.py").write_text(CUDA)
    (top / "train.py").chmod(0o640)
    copy_tree(top, tmp_path / "work")  # the ordinary copy still keeps bytes, mode and links
    assert (tmp_path / "work" / "train.py").read_text() == CUDA
    assert (tmp_path / "work" / "train.py").stat().st_mode & 0o777 == 0o640
    assert (tmp_path / "work" / "sub").is_symlink()


class SlowSuggest(Pipeline):
    """A pipeline whose suggest waits until released: each request holds a heavy slot."""

    def __init__(self):
        super().__init__()
        import threading

        self.release = threading.Event()
        self.waiting = threading.Semaphore(0)

    def suggest(self, source, path=None, options=None, **kwargs):
        self.waiting.release()
        self.release.wait(60)
        return super().suggest(source, path, options, **kwargs)


def hold_slots_with_forged_addresses(url: str, pipeline: SlowSuggest) -> int:
    """Three slow requests from this process, each naming another address: the third's status (429 when the
    per-client share held, 200 when it got a slot)."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    body = {"source": CUDA, "options": {"k": 0}}

    def post(i: int) -> httpx.Response:
        return httpx.post(f"{url}/v1/suggest", json=body, headers={"X-Forwarded-For": f"10.0.0.{i}"}, timeout=60)

    with ThreadPoolExecutor(3) as pool:
        slow = [pool.submit(post, i) for i in (1, 2)]
        for _ in slow:
            assert pipeline.waiting.acquire(timeout=30)
        third = pool.submit(post, 3)
        pipeline.waiting.acquire(timeout=3)  # taken when the third got a slot; a 429 comes back at once
        pipeline.release.set()
        return third.result().status_code


def test_a_local_client_cannot_pose_as_many_clients_with_forwarded_headers(monkeypatch):
    """F5 variant: uvicorn trusts X-Forwarded-For from 127.0.0.1 by default, so one local process named a new
    address in each request and held every heavy slot. Both HTTP fronts serve with proxy headers off."""
    import uvicorn
    from live_server import running
    from typer.testing import CliRunner
    from xlaport.serve.mcp import run_server

    from xlaport.cli import app

    served: list[dict] = []
    monkeypatch.setattr(uvicorn, "run", lambda *args, **kwargs: served.append(kwargs))
    monkeypatch.setenv("XLAPORT_TOKEN", TOKEN)
    assert CliRunner().invoke(app, ["serve", "--port", "0"]).exit_code == 0
    run_server("http", port=0)
    assert [kwargs.get("proxy_headers") for kwargs in served] == [False, False]
    monkeypatch.undo()
    # what that setting keeps: forged addresses are one client (this process), refused its third slot
    pipeline = SlowSuggest()
    with running(create_app(pipeline, token=None, warm_up=False, max_concurrency=4), proxy_headers=False) as url:
        assert hold_slots_with_forged_addresses(url, pipeline) == 429


def descendants_of(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    stat_line = Path(f"/proc/{entry}/stat").read_text()
                except OSError:
                    continue
                if int(stat_line.rsplit(")", 1)[1].split()[1]) == parent:
                    found.append(int(entry))
                    todo.append(int(entry))
    return found


@pytest.mark.slow
def test_migrate_pool_workers_die_with_a_killed_parent(tmp_path):
    """N14: a `migrate -j 2` killed with SIGKILL left its worker processes alive (8, 40 min later)."""
    import subprocess
    import sys
    import time

    src = tmp_path / "src"
    src.mkdir()
    for i in range(120):
        (src / f"m{i}.py").write_text(CUDA * 40)
    exe = Path(sys.executable).with_name("xlaport")
    proc = subprocess.Popen(
        [str(exe), "migrate", str(src), "--out", str(tmp_path / "out"), "-j", "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while len(children := descendants_of(proc.pid)) < 4:  # resource tracker, fork server, two workers
            assert time.monotonic() < deadline and proc.poll() is None, children
            time.sleep(0.3)
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 30  # a worker busy importing notices its parent's death when it is done
    while any(Path(f"/proc/{pid}").exists() for pid in children) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert [pid for pid in children if Path(f"/proc/{pid}").exists()] == []


def tree_behind_a_private_folder(tmp_path: Path) -> tuple[Path, Path]:
    """A server root holding `private/` (0700, root's) with two readable trees in it: what the sandbox user
    cannot reach on its own, each file of it 0644."""
    root = tmp_path / "root"
    private = root / "private"
    for side in ("original", "migrated"):
        (private / side).mkdir(parents=True)
        script = private / side / "train.py"
        script.write_text("SECRET = 'hunter2'\nprint(SECRET)\nfor i in range(3):\n    print(f'loss: {1 / (i + 1)}')\n")
        script.chmod(0o644)
        (private / side).chmod(0o755)
    root.chmod(0o755)
    private.chmod(0o700)
    return root, private


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox user exists only for root")
@pytest.mark.parametrize(
    "tool, arguments",
    [
        ("verify_migration", {"original_dir": "private/original", "migrated_dir": "private/migrated"}),
        ("verify_migration", {"project_root": "private/original", "path": "train.py", "source": "print(1)\n"}),
        ("check_xla", {"script_path": "private/original/train.py", "timeout_s": 60}),
        ("check_xla", {"source": "print(1)\n", "cwd": "private/original", "timeout_s": 60}),
    ],
)
def test_a_tree_behind_a_folder_the_sandbox_user_cannot_enter_is_never_shown_to_a_run(tmp_path, tool, arguments):
    """verify_migration copies the trees into the sandbox user's scratch, and check_xla mounts the script's
    folder back where it was: a tree inside a 0700 folder of the server's root, which the sandbox user cannot
    enter, was run and its output (here the secret the script prints) came back to the client. Refused before
    any run, naming the folder and its mode, with what to do."""
    root, private = tree_behind_a_private_folder(tmp_path)
    server = create_server(Pipeline(), allow_execution=True, allow_writes=False, root=root)
    result = call(server, tool, {"command": "python train.py", **arguments} if tool != "check_xla" else arguments)
    error = error_of(result)
    assert error["code"] == "unreadable_to_sandbox", error
    assert f"cannot read {private} (drwx------ uid 0)" in error["message"]
    assert "chmod" in error["next_step"] and "hunter2" not in result.content[0].text


def _swap_pkg_for_a_link_after_the_check(monkeypatch, root: Path, outside: Path) -> None:
    """Right after the write's check, root/pkg becomes a link to `outside` (the race, made deterministic)."""
    from xlaport import files

    checked = files.check_writable

    def check_then_swap(path: Path) -> None:
        checked(path)
        if not (root / "pkg").is_symlink():
            (root / "pkg").rename(root / "pkg-moved")
            (root / "pkg").symlink_to(outside)

    monkeypatch.setattr(files, "check_writable", check_then_swap)


@pytest.mark.parametrize("write", ["atomic_write", "write_with_backup", "copy_file"])
def test_a_folder_swapped_for_a_link_between_the_check_and_the_write_is_not_written_through(
    tmp_path, monkeypatch, write
):
    """A confined write (MCP migrate_repo with --root) checked the file's real path, then created its temporary
    and renamed it by name: a folder on the way swapped for a link out of the root in between put the file (or the
    backup, or the copy) outside. The folder is opened once and the write made relative to it, checked on the
    descriptor. The swap is made deterministic by doing it right after the check."""
    from xlaport import files

    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "pkg").mkdir(parents=True)
    outside.mkdir()
    target = root / "pkg" / "train.py"
    target.write_text("old\n")
    (outside / "train.py").write_text("outside\n")
    _swap_pkg_for_a_link_after_the_check(monkeypatch, root, outside)
    source = tmp_path / "source.py"
    source.write_text("copied\n")
    with files.writes_confined_to(root), pytest.raises(files.WriteFailed, match="no longer inside"):
        if write == "atomic_write":
            files.atomic_write(target, "new\n")
        elif write == "write_with_backup":
            files.write_with_backup(target, "new\n", backup=True)
        else:
            files.copy_file(source, target)
    assert [p.name for p in outside.iterdir()] == ["train.py"] and (outside / "train.py").read_text() == "outside\n"
    assert sorted(p.name for p in (root / "pkg-moved").iterdir()) == ["train.py"]
    assert (root / "pkg-moved" / "train.py").read_text() == "old\n"


@pytest.mark.parametrize("write", ["atomic_write", "copy_file"])
def test_a_missing_folder_is_never_created_through_a_link_swapped_in_after_the_check(tmp_path, monkeypatch, write):
    """The new file's folders do not exist yet: they were created by name after the check, so a folder on the way
    swapped for a link out of the root made an empty folder outside (the write itself was refused). They are
    created one level at a time relative to the opened parent, only inside the root."""
    from xlaport import files

    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "pkg").mkdir(parents=True)
    outside.mkdir()
    target = root / "pkg" / "new" / "deeper" / "train.py"
    _swap_pkg_for_a_link_after_the_check(monkeypatch, root, outside)
    source = tmp_path / "source.py"
    source.write_text("copied\n")
    with files.writes_confined_to(root), pytest.raises(files.WriteFailed, match="no longer inside"):
        if write == "atomic_write":
            files.atomic_write(target, "new\n")
        else:
            files.copy_file(source, target)
    assert list(outside.iterdir()) == []  # nothing made outside, not even an empty folder
    assert list((root / "pkg-moved").iterdir()) == []


def test_missing_folders_inside_the_root_are_still_created(tmp_path):
    from xlaport import files

    root = tmp_path / "root"
    root.mkdir()
    with files.writes_confined_to(root):
        files.atomic_write(root / "a" / "b" / "c.py", "x = 1\n")
    assert (root / "a" / "b" / "c.py").read_text() == "x = 1\n"
