"""`xlaport lint --format json` and `--format sarif` on a small project (PROJECT: a CUDA script whose name has a
space, a file that does not parse, a config file) give exactly the recorded outputs (tests/fixtures/outputs/), and
the SARIF log is valid against the official SARIF 2.1.0 schema (tests/fixtures/sarif/, see its README) and carries
what GitHub code scanning reads.

A change that means to alter these outputs regenerates the snapshots and shows the difference in review:

    .venv/bin/python tests/kb/test_output_snapshot.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlparse

import jsonschema
import pytest
from typer.testing import CliRunner
from xlaport.kb.report_formats import DOCS_URL_ENV, FINGERPRINT_KEY
from xlaport.kb.text_edits import apply_edits

from xlaport.cli import app

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "outputs"
SCHEMA = ROOT / "tests" / "fixtures" / "sarif" / "sarif-schema-2.1.0.json"
SNAPSHOTS = {"json": FIXTURES / "lint.json", "sarif": FIXTURES / "lint.sarif.json"}


TRAIN = '''"""A small CUDA training script."""

import torch

torch.backends.cudnn.benchmark = True
model = torch.nn.Linear(4, 2).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
for step in range(10):
    batch = torch.randn(8, 4, device="cuda")
    loss = model(batch).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step}: loss {loss.item()}")
torch.cuda.empty_cache()
'''
PROJECT = {
    "train step.py": TRAIN,
    "broken.py": "def broken(:\n    pass\n",
    "conf/train.yaml": "trainer:\n  device: cuda:0\n",
}


def lint(format: str) -> dict:
    """The lint output of PROJECT, written in a scratch folder and linted from there (relative paths, as a CI job
    in its checkout gives them)."""
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="xlaport-outputs-") as scratch:
        for name, text in PROJECT.items():
            path = Path(scratch, "project", name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        os.chdir(scratch)
        try:
            result = CliRunner().invoke(app, ["lint", "project", "--format", format, "-j", "1"])
        finally:
            os.chdir(cwd)
    assert result.exit_code == 1, result.output
    return json.loads(result.stdout)


def stable(log: dict, format: str) -> dict:
    """What the snapshot records: the version and the working folder replaced; for SARIF, the rules that results
    name, by their identity and shape (their docs text is the kb's, tested with the kb)."""
    log = json.loads(json.dumps(log))
    if format == "json":
        log["tool"]["version"] = "VERSION"
        return log
    run = log["runs"][0]
    driver = run["tool"]["driver"]
    driver["version"] = driver["semanticVersion"] = "VERSION"
    named = {r["ruleId"] for r in run["results"]}
    driver["rules"] = [
        {"id": r["id"], "level": r["defaultConfiguration"]["level"], "helpUri": page(r["helpUri"]), "keys": sorted(r)}
        for r in driver["rules"]
        if r["id"] in named
    ]
    run["originalUriBaseIds"]["%SRCROOT%"]["uri"] = "file:///WORKDIR/"
    return log


def page(uri: str) -> str:
    """A helpUri without the folder of the local pages (a hash of their text: every kb change moves it)."""
    return "DOCS/" + uri.rsplit("/", 1)[-1]


@pytest.fixture(autouse=True)
def default_docs_url(monkeypatch):
    monkeypatch.delenv(DOCS_URL_ENV, raising=False)


@pytest.mark.parametrize("format", ["json", "sarif"])
def test_lint_output_matches_the_snapshot(format: str):
    found = stable(lint(format), format)
    expected = json.loads(SNAPSHOTS[format].read_text())
    assert found == expected, f"regenerate with `.venv/bin/python {Path(__file__).relative_to(ROOT)}` if meant"


def sarif_errors(log: dict) -> list[str]:
    schema = json.loads(SCHEMA.read_text())
    validator = jsonschema.Draft4Validator(schema, format_checker=jsonschema.Draft4Validator.FORMAT_CHECKER)
    return [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(log)]


def test_sarif_is_valid_against_the_official_schema():
    log = lint("sarif")
    assert sarif_errors(log) == []
    # the validator does reject what the schema forbids (a level SARIF does not have, a line 0)
    broken = json.loads(json.dumps(log))
    broken["runs"][0]["results"][0]["level"] = "fatal"
    broken["runs"][0]["results"][1]["locations"][0]["physicalLocation"]["region"]["startLine"] = 0
    assert len(sarif_errors(broken)) == 2


def test_sarif_has_what_github_code_scanning_reads():
    log = lint("sarif")
    assert log["$schema"] and log["version"] == "2.1.0"
    run = log["runs"][0]
    driver = run["tool"]["driver"]
    assert driver["name"] == "xlaport" and driver["version"]
    assert "informationUri" not in driver  # xlaport has no public site: no made-up address
    rules = {r["id"]: r for r in driver["rules"]}
    for rule in rules.values():
        assert rule["shortDescription"]["text"] and rule["fullDescription"]["text"]
        assert rule["help"]["text"] and rule["help"]["markdown"].startswith(f"# {rule['id']}: ")
        # by default the rule's page in the local copy of `xlaport kb docs`: a link that opens
        help_uri = urlparse(rule["helpUri"])
        assert help_uri.scheme == "file" and rule["helpUri"].endswith(f"/{rule['id']}.html")
        assert f"<h1>{rule['id']}: " in Path(unquote(help_uri.path)).read_text()
        assert rule["defaultConfiguration"]["level"] in ("error", "warning", "note")
    results = run["results"]
    assert {r["level"] for r in results} == {"error", "warning", "note"}  # levels by severity, not all "warning"
    hashes = [r["partialFingerprints"][FINGERPRINT_KEY] for r in results]
    assert len(set(hashes)) == len(hashes)
    for result in results:
        assert result["ruleId"] in rules and result["message"]["text"]
        [location] = result["locations"]
        region = location["physicalLocation"]["region"]
        # GitHub's table marks all four required, for config files (project/conf/train.yaml) too
        assert region["startLine"] >= 1 and region["startColumn"] >= 1
        assert (region["endLine"], region["endColumn"]) > (region["startLine"], region["startColumn"])
    uris = {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in results}
    assert "project/train%20step.py" in uris
    [notification] = run["invocations"][0]["toolExecutionNotifications"]
    assert notification["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "project/broken.py"


# Our own lines, with the hashes that a BigInt transliteration of the CodeQL action's src/fingerprints.ts gave
# under node (the transliteration first reproduced the hashes of that file's own tests)
CUDA_LINES = 'import torch\n\nmodel = torch.nn.Linear(4, 2).cuda()\nx = torch.randn(8, 4, device="cuda")\n'
CUDA_LINE_HASHES = {
    1: "39d5df58f6ba20c3:1",
    2: "ca2fcc9dec5459f2:1",
    3: "40c86ccd29106d90:1",
    4: "a0092b6684df355e:1",
    5: "c129715d7a2bc9a3:1",  # the empty line after the last newline
}


def test_line_hash_is_githubs():
    from xlaport.kb.report_formats import line_hashes

    assert line_hashes(CUDA_LINES) == CUDA_LINE_HASHES
    # spaces, tabs and line ends do not count; what follows a line within 100 characters does
    respaced = CUDA_LINES.replace("\n", "\r\n").replace(" = ", "  =\t").replace("(4, 2)", "(4,2)")
    assert line_hashes(respaced) == CUDA_LINE_HASHES
    assert line_hashes(CUDA_LINES.replace("8, 4", "8, 5"))[3] != CUDA_LINE_HASHES[3]
    # the same hash again in the file: the occurrence count
    repeated = line_hashes("x = 1\n" * 40)
    assert repeated[1].endswith(":1") and repeated[2] == repeated[1].replace(":1", ":2")


def test_sarif_results_carry_githubs_line_hash():
    from xlaport.kb.report_formats import line_hashes

    log = lint("sarif")
    assert sarif_errors(log) == []
    results = log["runs"][0]["results"]
    for result in results:
        location = result["locations"][0]["physicalLocation"]
        name = unquote(location["artifactLocation"]["uri"]).removeprefix("project/")
        line = location["region"]["startLine"]
        assert result["partialFingerprints"]["primaryLocationLineHash"] == line_hashes(PROJECT[name])[line]


def test_each_fix_applied_alone_is_the_rewrite_of_its_finding():
    """The edits of every fixable finding, applied to the file, give valid Python without that finding."""
    from xlaport.kb import lint_source

    findings = lint_source(TRAIN, "train.py", edits=True)
    fixable = [f for f in findings if f.fixable]
    assert len(fixable) >= 5 and all(f.edits for f in fixable)
    assert not any(f.edits for f in findings if not f.fixable)
    for finding in fixable:
        fixed = apply_edits(TRAIN, finding.edits)
        compile(fixed, "train.py", "exec")
        left = {f.code for f in lint_source(fixed, "train.py")}
        assert finding.code not in left, (finding.code, fixed)


def test_without_a_writable_cache_the_sarif_log_has_no_help_uri(monkeypatch, tmp_path: Path):
    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache folder would be")
    monkeypatch.setenv("XLAPORT_CACHE_DIR", str(blocked))
    log = lint("sarif")
    assert sarif_errors(log) == []
    assert all("helpUri" not in rule for rule in log["runs"][0]["tool"]["driver"]["rules"])


def test_the_sarif_help_uri_base_can_be_moved(monkeypatch):
    monkeypatch.setenv(DOCS_URL_ENV, "https://docs.example.org/xlaport")
    rules = lint("sarif")["runs"][0]["tool"]["driver"]["rules"]
    assert rules[0]["helpUri"] == f"https://docs.example.org/xlaport/{rules[0]['id']}.html"


if __name__ == "__main__":  # regenerate the snapshots
    os.environ.pop(DOCS_URL_ENV, None)
    for format, path in SNAPSHOTS.items():
        path.write_text(json.dumps(stable(lint(format), format), indent=1) + "\n")
        print(f"wrote {path}", file=sys.stderr)


def test_every_fix_of_the_kb_fixtures_applied_alone_leaves_valid_python():
    """Each fixable finding's edits, applied alone to its kb fixture (tests/fixtures/kb/*/input.py), compile."""
    from xlaport.kb import lint_source

    applied = 0
    for path in sorted((ROOT / "tests" / "fixtures" / "kb").glob("*/input.py")):
        source = path.read_text()
        for finding in lint_source(source, path.name, edits=True):
            if finding.edits:
                compile(apply_edits(source, finding.edits), f"{path.parent.name}: {finding.code}", "exec")
                applied += 1
    assert applied > 200


def test_a_fix_that_cannot_be_applied_alone_keeps_its_finding_without_edits(monkeypatch):
    from xlaport.kb import engine, lint_source

    expected = [(f.line, f.code) for f in lint_source(TRAIN, "train.py")]

    def refuses(module, chosen):
        raise ValueError("needs the other edits of its rule")

    monkeypatch.setattr(engine, "_apply", refuses)
    found = lint_source(TRAIN, "train.py", edits=True)
    assert [(f.line, f.code) for f in found] == expected and not any(f.edits for f in found)
