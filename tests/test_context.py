"""Suggest and check in the project's context (issue 31 items 1-2), over real HTTP (uvicorn) and real MCP stdio.

The fixture project (tests/fixtures/context_project) runs only in its context: train.py imports two sibling
modules and reads data/points.txt by a relative path; blocks.py is a module without an entry point.
"""

import asyncio
import base64
import io
import json
import os
import sys
import tarfile
import zipfile
from pathlib import Path

import httpx
import mcp
import pytest
from live_server import running
from mcp.client.stdio import StdioServerParameters
from xlaport.kb.retrieval import cache_dir
from xlaport.serve.http import create_app
from xlaport.serve.lines import to_original_lines
from xlaport.serve.mcp import create_server
from xlaport.serve.pipeline import Pipeline
from xlaport.serve.project import MAX_PROJECT_FILES, ProjectError, ProjectFiles, ProjectTooLarge, sent_project
from xlaport.serve.results import SuggestOptions
from xlaport.serve.validation import has_entry_point
from xlaport.serve.wording import api_wording

PROJECT = Path(__file__).resolve().parent / "fixtures" / "context_project"
TOKEN = "context-s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def project_files() -> dict[str, str]:
    return {str(p.relative_to(PROJECT)): p.read_text() for p in sorted(PROJECT.rglob("*")) if p.is_file()}


def tar_of(members: dict[str, bytes], link: str | None = None) -> str:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if link:
            info = tarfile.TarInfo(link)
            info.type = tarfile.SYMTYPE
            info.linkname = "/etc/passwd"
            tar.addfile(info)
    return base64.b64encode(buffer.getvalue()).decode()


# --- the project as sent: bounds and paths ---------------------------------------------------------------------
def test_a_sent_project_is_checked_before_anything_is_written():
    files = {"a.py": "x = 1\n", "pkg/b.py": "y = 2\n"}
    assert sent_project(ProjectFiles(files=files)).files == {"a.py": b"x = 1\n", "pkg/b.py": b"y = 2\n"}
    unpacked = sent_project(ProjectFiles(archive=tar_of({"./a.py": b"1", "data/d.bin": b"\x00\x01"})))
    assert unpacked.files == {"a.py": b"1", "data/d.bin": b"\x00\x01"}
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w") as archive:
        archive.writestr("src/m.py", "z = 3\n")
    assert sent_project(ProjectFiles(archive=base64.b64encode(zipped.getvalue()).decode())).files == {
        "src/m.py": b"z = 3\n"
    }
    for bad in ({"../up.py": ""}, {"/abs.py": ""}, {"a.py": "", "a.py/b.py": ""}):
        with pytest.raises(ProjectError):
            sent_project(ProjectFiles(files=bad))
    with pytest.raises(ProjectError, match="not a regular file"):
        sent_project(ProjectFiles(archive=tar_of({"a.py": b"1"}, link="data")))
    with pytest.raises(ProjectError, match="base64"):
        sent_project(ProjectFiles(archive="not base64!"))
    with pytest.raises(ProjectError, match="not both"):
        sent_project(ProjectFiles(files={"a.py": ""}, archive=tar_of({})))
    with pytest.raises(ProjectTooLarge):
        sent_project(ProjectFiles(files={f"f{i}.py": "" for i in range(MAX_PROJECT_FILES + 1)}))


def test_http_refuses_a_bad_or_oversized_project_with_413_and_422():
    source = "import torch\nx = torch.ones(2).cuda()\n"
    with running(create_app(Pipeline(), token=TOKEN, warm_up=False)) as url, httpx.Client(base_url=url) as client:
        many = {f"f{i}.py": "" for i in range(MAX_PROJECT_FILES + 1)}
        big = client.post("/v1/suggest", json={"source": source, "path": "a.py", "project": {"files": many}})
        assert big.status_code == 413 and "at most" in big.json()["detail"]
        up = client.post("/v1/suggest", json={"source": source, "path": "a.py", "project": {"files": {"../a": ""}}})
        assert up.status_code == 422 and "inside the project" in up.json()["detail"][0]["msg"]
        no_path = client.post("/v1/suggest", json={"source": source, "project": {"files": {"b.py": ""}}})
        assert no_path.status_code == 422 and "`path` is needed" in no_path.json()["detail"][0]["msg"]
        check = client.post("/v1/check", json={"args": []}, headers=AUTH)
        assert check.status_code == 422 and "project" in check.json()["detail"][0]["msg"]


# --- entry points, line numbers, wording -------------------------------------------------------------------
def test_entry_points_are_told_from_modules():
    assert has_entry_point((PROJECT / "train.py").read_text())
    assert not has_entry_point((PROJECT / "blocks.py").read_text())
    assert has_entry_point("def main():\n    pass\n\nif __name__ == '__main__':\n    main()\n")
    assert not has_entry_point("import torch\nX = 3\n\nclass A:\n    pass\n")


def test_items_left_for_a_human_are_in_the_original_files_lines():
    source = (PROJECT / "train.py").read_text()
    patch = Pipeline().suggest(source, "train.py", SuggestOptions(k=0))
    assert patch.manual, "the fixture keeps a host read (`loss.item()`) for a human"
    original_lines = source.splitlines()
    migrated_lines = patch.migrated.splitlines()
    for item in patch.manual:
        assert item.migrated_line != item.finding.line  # the fixes added lines above it
        assert original_lines[item.finding.line - 1] == migrated_lines[item.migrated_line - 1]
    applied = {f.line for f in patch.applied}
    assert all(original_lines[line - 1].strip() for line in applied)
    shift = to_original_lines("a\nb\n", "import x\na\nnew\nb\n")
    assert [shift(n) for n in (1, 2, 3, 4)] == [1, 1, 2, 2]


def test_api_results_use_parameter_names_not_command_line_options():
    assert "--unsafe-fixes" not in api_wording("`xlaport migrate --unsafe-fixes` applies XLA501")
    assert "unsafe_fixes: true" in api_wording("applied only with `--unsafe-fixes`. Review the diff.")
    assert "`cwd`" in api_wording("run it with --workdir DIR (workdir= in the API)")
    patch = Pipeline().suggest(
        "import torch\nfrom torch.cuda.amp import GradScaler\nscaler = GradScaler()\n", "a.py", SuggestOptions(k=0)
    )
    server = create_server(Pipeline(), allow_execution=False)
    text = json.dumps(
        call(server, "suggest_patch", {"source": patch.migrated, "path": "a.py", "k": 0}).structured_content
    )
    assert "--unsafe-fixes" not in text and "--workdir" not in text


def call(server, name: str, arguments: dict):
    async def go():
        async with mcp.Client(server) as client:
            return await client.call_tool(name, arguments)

    return asyncio.run(go())


def test_every_mcp_parameter_is_described_and_errors_are_structured(tmp_path):
    async def tools():
        async with mcp.Client(create_server(Pipeline(), allow_execution=False)) as client:
            return (await client.list_tools()).tools

    for tool in asyncio.run(tools()):
        for name, schema in tool.input_schema["properties"].items():
            assert len(schema.get("description", "")) > 15, f"{tool.name}.{name} has no description"
    server = create_server(Pipeline(), allow_execution=False, root=tmp_path)
    outside = call(server, "suggest_patch", {"project_root": "..", "path": "a.py"})
    error = json.loads(outside.content[0].text.partition(": ")[2])
    assert outside.is_error and error["code"] == "outside_root" and error["next_step"]
    refused = json.loads(call(server, "check_xla", {"source": "print(1)\n"}).content[0].text.partition(": ")[2])
    assert refused["code"] == "not_allowed" and "--exec" not in refused["next_step"]
    broken = json.loads(call(server, "suggest_patch", {"source": "def f(:\n"}).content[0].text.partition(": ")[2])
    assert broken["code"] == "cannot_parse" and "cannot parse" in broken["message"]
    no_source = json.loads(call(server, "suggest_patch", {"path": "a.py"}).content[0].text.partition(": ")[2])
    assert no_source["code"] == "bad_input" and "project_root" in no_source["next_step"]


# --- real runs ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_http_validates_a_file_in_its_project_and_says_what_to_send_without_it():
    """The repro: the file alone was 'rejected' (its sibling modules missing). Sent with its project it validates;
    sent alone it is unvalidated, naming the module and what to send."""
    source = (PROJECT / "train.py").read_text()
    options = {"validate_patch": True, "k": 0, "timeout_s": 300}
    with running(create_app(Pipeline(), token=TOKEN, warm_up=False)) as url:
        with httpx.Client(base_url=url, headers=AUTH, timeout=1200) as client:
            alone = client.post("/v1/suggest", json={"source": source, "path": "train.py", "options": options})
            files = project_files()
            archive = tar_of({k: v.encode() for k, v in files.items()})
            body = {"source": source, "path": "train.py", "options": options, "project": {"archive": archive}}
            sent = client.post("/v1/suggest", json=body)
    assert alone.status_code == 200 and sent.status_code == 200, (alone.text, sent.text)
    evidence = alone.json()["evidence"]
    assert evidence["status"] == "unvalidated", evidence
    assert "`blocks`" in evidence["reason"] and "project" in evidence["reason"]
    evidence = sent.json()["evidence"]
    assert evidence["status"] == "validated", evidence
    assert evidence["level"] == "L2" and "entry point" in evidence["ran"]


@pytest.mark.slow
def test_mcp_stdio_validates_a_module_by_its_tests_and_checks_from_the_working_folder(tmp_path):
    """A module without an entry point is validated by generated tests (never 'no XLA step'); check_xla runs a
    script from its folder, so a relative data path is found."""
    exe = Path(sys.executable).with_name("xlaport")
    env = {**os.environ, "XLAPORT_CACHE_DIR": str(cache_dir())}
    params = StdioServerParameters(command=str(exe), args=["mcp", "--root", str(PROJECT.parent)], env=env)

    async def go():
        async with mcp.Client(params, read_timeout_seconds=1200) as client:
            module = await client.call_tool(
                "suggest_patch",
                {"project_root": PROJECT.name, "path": "blocks.py", "validate": True, "k": 0, "timeout_s": 300},
            )
            checked = await client.call_tool("check_xla", {"script_path": f"{PROJECT.name}/train.py", "timeout_s": 300})
            return module, checked

    module, checked = asyncio.run(go())
    assert not module.is_error, module.content[0].text
    evidence = module.structured_content["evidence"]
    assert evidence["status"] == "validated", evidence
    assert "no entry point" in evidence["ran"] and [c["name"] for c in evidence["checks"]] == ["generated_tests"]
    assert not checked.is_error, checked.content[0].text
    reasons = " ".join(checked.structured_content["check"]["reasons"])
    assert "points.txt" not in reasons and "ModuleNotFoundError" not in reasons, reasons


def test_a_run_that_misses_its_context_is_no_evidence_against_the_patch():
    from xlaport.serve.results import CheckRun
    from xlaport.serve.validation import _context_failure

    def failed(last_line: str, exit_code: int = 1) -> CheckRun:
        error = f'Traceback (most recent call last):\n  File "train.py", line 3, in <module>\n{last_line}'
        report = {"exit_code": exit_code, "error": error, "steps": 0, "optimizer_steps": 0}
        return CheckRun(name="xla_check", passed=False, level="none", reasons=["exited"], report=report)

    missing = _context_failure(failed("ModuleNotFoundError: No module named 'sibling_utils'"), False, ".")
    assert missing.passed is None and "`sibling_utils`" in missing.reasons[0] and "project_root" in missing.reasons[0]
    installed = failed("ModuleNotFoundError: No module named 'json'")  # importable here: a real failure
    assert _context_failure(installed, True, ".") is None
    data = _context_failure(failed("FileNotFoundError: [Errno 2] No such file or directory: 'data/x.csv'"), True, "src")
    assert data.passed is None and "`data/x.csv`" in data.reasons[0] and "`src`" in data.reasons[0]
    offline = _context_failure(
        failed("RuntimeError: Dataset not found. You can use download=True to download it"), True, "."
    )
    assert offline.passed is None and "network" in offline.reasons[0]
    assert _context_failure(failed("RuntimeError: Expected XLA tensor. Got: torch.FloatTensor"), True, ".") is None
    clean = failed("", exit_code=0)
    clean.report["torch_xla_imported"] = True
    assert _context_failure(clean, True, ".").report["not_applicable"]
    elsewhere = failed("", exit_code=0)  # never imported torch_xla: other files still pick the device
    assert _context_failure(elsewhere, True, ".").passed is None and "not migrated yet" in elsewhere_reason(elsewhere)


def elsewhere_reason(run):
    from xlaport.serve.validation import _context_failure

    return _context_failure(run, True, ".").reasons[0]


def test_a_local_project_is_copied_without_its_caches_and_within_bounds(tmp_path, monkeypatch):
    from xlaport.serve import project as project_module
    from xlaport.serve.project import local_project

    root = tmp_path / "repo"
    for rel in ("train.py", "pkg/util.py", ".git/HEAD", ".venv/lib/x.py", "pkg/__pycache__/u.pyc", "data/a.txt"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x")
    assert local_project(root).write_to(tmp_path / "copy") == 3
    copied = sorted(str(p.relative_to(tmp_path / "copy")) for p in (tmp_path / "copy").rglob("*") if p.is_file())
    assert copied == ["data/a.txt", "pkg/util.py", "train.py"]
    monkeypatch.setattr(project_module, "MAX_PROJECT_FILES", 2)
    with pytest.raises(ProjectTooLarge, match="project_root"):
        local_project(root).write_to(tmp_path / "copy2")
    with pytest.raises(ProjectError):
        local_project(tmp_path / "missing")


def test_a_failure_the_original_shares_is_not_the_patchs():
    from xlaport.serve.results import CheckRun
    from xlaport.serve.validation import _original_fails_alike

    last = "RuntimeError: output with shape [1, 28, 28] doesn't match the broadcast shape [3, 28, 28]"
    run = CheckRun(name="xla_check", passed=False, level="none", report={"error": f"Traceback ...\n{last}"})
    judged = _original_fails_alike(run, f"Traceback ...\n{last}")
    assert judged.passed is None and "original program fails the same way" in judged.reasons[0]
    assert _original_fails_alike(run, "") is None  # the original ran: the patch broke it

    # one failure, worded by torch on the CPU and by torch_xla differently (InfoGAN's int64 labels given to BCELoss
    # under torch 2.9): the same line of the user's code fails in both runs
    def traceback_at(line: str, message: str) -> str:
        return (
            'Traceback (most recent call last):\n  File "/w/project/train.py", line 151, in <module>\n'
            f'    {line}\n  File "/v/lib/python3.11/site-packages/torch/nn/modules/loss.py", line 699, in forward\n'
            f"    return F.binary_cross_entropy(input, target)\n{message}"
        )

    failing = "loss_real = criterionD(probs_real, label)"
    xla = traceback_at(failing, "RuntimeError: Binary op subtract with different element types: f32[] and s64[128].")
    run = CheckRun(name="xla_check", passed=False, level="none", report={"error": xla})
    cpu = traceback_at(failing, "RuntimeError: Found dtype Long but expected Float")
    judged = _original_fails_alike(run, cpu)
    assert judged.passed is None and "fails at the same line" in judged.reasons[0] and failing in judged.reasons[0]
    elsewhere = traceback_at(
        "loss = criterionD(probs_fake, label)", "RuntimeError: Found dtype Long but expected Float"
    )
    assert _original_fails_alike(run, elsewhere) is None  # the original failed elsewhere: the patch is to blame


# trains, then saves into a folder the user was to make first (Cutout's train.py: its README has `mkdir checkpoints`)
SAVES_INTO_A_MISSING_FOLDER = """\
import torch

model = torch.nn.Linear(4, 2).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    x = torch.randn(8, 4).cuda()
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
torch.save(model.state_dict(), "checkpoints/model.pt")
"""


@pytest.mark.slow
def test_a_patch_is_not_rejected_for_a_line_the_original_fails_at_too():
    """Real runs. The migrated program trains, then fails at its last line, as the original does: 'could not
    judge', not 'rejected' (it was 'rejected': the original was never run in a project's validation, so the rule
    'the original fails at the same line' never applied: Cutout's train.py, torch.save into a missing folder)."""
    project = sent_project(ProjectFiles(files={"train.py": SAVES_INTO_A_MISSING_FOLDER}))
    options = SuggestOptions(k=0, validate_patch=True, timeout_s=300)
    patch = Pipeline().suggest(SAVES_INTO_A_MISSING_FOLDER, "train.py", options, project=project)
    evidence = patch.evidence
    assert evidence.status != "rejected", evidence.reason
    run = next(c for c in evidence.checks if c.name == "xla_check")
    assert run.passed is None and "could not judge" in run.reasons[0], run.reasons
    assert "original program fails the same way" in run.reasons[0] and "checkpoints" in run.reasons[0], run.reasons


# the user's migrated script: the device comes from torch_xla, but a sibling module still moves batches with .cuda()
SIBLING_TRAIN = """\
import torch
import torch_xla

import helpers

model = torch.nn.Linear(4, 2).to(torch_xla.device())
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    x = helpers.to_device(torch.randn(8, 4), use_gpu=True)
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    torch_xla.sync()
"""
SIBLING_CUDA = """\
def to_device(batch, use_gpu):
    if use_gpu:
        return batch.cuda()
    return batch
"""
SIBLING_BROKEN = """\
def to_device(batch, use_gpu):
    raise ValueError("the batch has the wrong shape")
"""


@pytest.mark.slow
def test_a_run_failing_in_an_unmigrated_sibling_names_it_and_a_real_failure_names_its_line():
    """Real runs. The patched file is right but the program fails in a sibling module that still calls .cuda():
    'could not judge', naming the sibling's line, its finding and what to do (it was 'rejected: Found no NVIDIA
    driver', with no file or line: cs230-code-examples' train.py + evaluate.py). A failure with no finding on the
    failing line stays a rejection, and its reason names the user's failing line."""
    from xlaport.serve.validation import check_in_project

    def check(helpers: str):
        project = sent_project(ProjectFiles(files={"train.py": SIBLING_TRAIN, "helpers.py": helpers}))
        return check_in_project(project, None, "train.py", [], None, None, 300, 4096)

    unmigrated = check(SIBLING_CUDA)
    assert unmigrated.passed is None, unmigrated
    reason = unmigrated.reasons[0]
    assert "helpers.py:3" in reason and "batch.cuda()" in reason and "XLA201" in reason, reason
    assert "suggest_patch" in reason and "NVIDIA driver" in reason, reason
    broken = check(SIBLING_BROKEN)
    assert broken.passed is False, broken
    assert "ValueError: the batch has the wrong shape" in broken.reasons[0], broken.reasons
    assert '(at helpers.py:2 `raise ValueError("the batch has the wrong shape")`)' in broken.reasons[0], broken.reasons


def test_the_failing_line_is_the_deepest_frame_in_the_users_code():
    from xlaport.eval.check.grade import failing_line

    lib = "/opt/venv/lib/python3.11/site-packages/torch/nn/modules"
    error = "\n".join(
        [
            "Traceback (most recent call last):",
            '  File "/scratch/project/src/train.py", line 40, in <module>',
            "    loss = step(batch)",
            '  File "/scratch/project/src/model.py", line 12, in forward',
            "    return self.fc(x)",
            f'  File "{lib}/module.py", line 1775, in _wrapped_call_impl',
            "    return self._call_impl(*args, **kwargs)",
            f'  File "{lib}/linear.py", line 134, in forward',
            "    return F.linear(input, self.weight, self.bias)",
            "RuntimeError: Expected XLA tensor. Got: torch.FloatTensor",
        ]
    )
    assert failing_line(error, "/scratch/project/src/train.py") == "model.py:12 `return self.fc(x)`"
    assert failing_line(error, "/elsewhere/run.py") == "model.py:12 `return self.fc(x)`"  # not below: the name
    assert failing_line("RuntimeError: no traceback", "/x/train.py") is None


# --- verify in the project's context (HTTP /v1/verify `project`, MCP verify_migration `project_root`) -----------
def _migrated_train() -> str:
    return Pipeline().suggest((PROJECT / "train.py").read_text(), "train.py", SuggestOptions(k=0)).migrated


@pytest.mark.slow
def test_http_verify_runs_both_copies_of_a_sent_project_and_rejects_a_wrong_sign():
    """The project travels with the migrated file (its siblings and data): the correct migration reaches L3 on
    the loss its original logs; the same with the loss's sign flipped fails on the training loss."""
    migrated = _migrated_train()
    body = {
        "project": {"files": project_files()},
        "path": "train.py",
        "migrated": migrated,
        "command": "python train.py",
    }
    with running(create_app(Pipeline(), token=TOKEN, warm_up=False)) as url:
        with httpx.Client(base_url=url, headers=AUTH, timeout=1200) as c:
            good = c.post("/v1/verify", json=body)
            flipped = migrated.replace("loss = ((model", "loss = -((model", 1)
            assert flipped != migrated
            wrong = c.post("/v1/verify", json={**body, "migrated": flipped})
            no_path = c.post("/v1/verify", json={**body, "path": None})
            bad_cwd = c.post("/v1/verify", json={**body, "cwd": "../elsewhere"})
    assert good.status_code == 200, good.text
    outcome = good.json()
    assert (outcome["status"], outcome["level"]) == ("pass", "L3"), outcome["reasons"]
    assert outcome["report"]["loss"]["steps_compared"] == 6 and outcome["report"]["migrated_run"]["device"].startswith(
        "xla"
    )
    assert wrong.status_code == 200 and wrong.json()["status"] == "fail", wrong.json()["reasons"]
    assert any("training loss" in r for r in wrong.json()["reasons"]), wrong.json()["reasons"]
    assert no_path.status_code == 422 and "`path` is needed" in no_path.text
    assert bad_cwd.status_code == 422 and "cwd" in bad_cwd.text


@pytest.mark.slow
def test_mcp_stdio_verify_migration_takes_the_project_root_and_the_patch():
    """An agent verifies a patch suggest_patch returned before applying it: project_root, path and source."""
    exe = Path(sys.executable).with_name("xlaport")
    env = {**os.environ, "XLAPORT_CACHE_DIR": str(cache_dir())}
    params = StdioServerParameters(command=str(exe), args=["mcp", "--root", str(PROJECT.parent)], env=env)
    arguments = {"project_root": PROJECT.name, "path": "train.py", "source": _migrated_train()}

    async def go():
        async with mcp.Client(params, read_timeout_seconds=1200) as client:
            verified = await client.call_tool("verify_migration", {**arguments, "command": "python train.py"})
            half = await client.call_tool("verify_migration", {"project_root": PROJECT.name, "command": "x.py"})
            return verified, half

    verified, half = asyncio.run(go())
    assert not verified.is_error, verified.content[0].text
    outcome = verified.structured_content
    assert (outcome["status"], outcome["level"]) == ("pass", "L3"), outcome["reasons"]
    assert half.is_error and "path" in half.content[0].text and "source" in half.content[0].text
