"""`pip install xlaport` is the linter: lint, fix, kb and a plain migrate run without any extra (scripts/test_core.sh
runs this file in a venv that has only the core), and a command whose extra is missing says which one to install."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import xlaport.extras as extras
from xlaport import cli

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize(
    ("arguments", "needed"),
    [
        (["lint", "x.py"], {}),
        (["fix", "x.py"], {}),
        (["kb", "list"], {}),
        (["kb", "search", "no driver"], {"search": "kb search"}),
        (["check", "train.py"], {"check": "check"}),
        (["testgen", "a", "b"], {"check": "testgen"}),
        (["verify", "a", "b", "--", "python", "t.py"], {"verify": "verify"}),
        (["train", "lora"], {"model": "train", "check": "train"}),
        (["mcp"], {"serve": "mcp"}),
        (["migrate", "src", "--out", "dst"], {}),
        (["migrate", "src", "--related", "0"], {}),
        (["migrate", "src", "--related=3"], {"search": "migrate --related"}),
        (
            ["migrate", "src", "--validate", "python t.py", "--verify", "python t.py"],
            {"check": "migrate --validate", "verify": "migrate --verify"},
        ),
        (["migrate", "src", "--", "--validate", "x"], {}),  # after `--`: not an option of migrate
        (["optimize", "dst"], {"check": "optimize"}),  # proposing alone imports the check's curves (numpy)
        (["optimize", "dst", "--verify", "python t.py"], {"check": "optimize", "verify": "optimize --verify"}),
    ],
)
def test_each_command_line_needs_its_extras(arguments, needed):
    assert extras.extras_for(arguments) == needed


def _run_main(monkeypatch, capsys, arguments: list[str]) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["xlaport", *arguments])
    with pytest.raises(SystemExit) as stopped:
        cli.main()
    return stopped.value.code, capsys.readouterr().err


def _without(monkeypatch, *modules: str) -> None:
    """As if `modules` were not installed: found by no probe, and importing one fails."""
    real = extras.find_spec
    monkeypatch.setattr(extras, "find_spec", lambda name: None if name in modules else real(name))
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)  # `import name` raises ModuleNotFoundError


def test_a_command_whose_extra_is_missing_says_which_to_install_before_doing_anything(monkeypatch, capsys, tmp_path):
    _without(monkeypatch, "torch", "torch_xla")
    script = tmp_path / "train.py"
    script.write_text("print('ran')\n")
    code, err = _run_main(monkeypatch, capsys, ["check", str(script)])
    assert code == 2
    # (the core venv also lacks numpy, which the check's curves use)
    assert err.startswith("error: `xlaport check` needs ") and "torch, torch_xla" in err
    assert err.endswith(", which this installation lacks: pip install 'xlaport[check]'\n")
    code, err = _run_main(monkeypatch, capsys, ["migrate", "src", "--out", "dst", "--validate", "python t.py"])
    assert code == 2 and err.startswith("error: `xlaport migrate --validate` needs ") and "xlaport[check]" in err


def test_help_needs_no_extra(monkeypatch, capsys):
    _without(monkeypatch, "torch", "torch_xla")
    code, _ = _run_main(monkeypatch, capsys, ["check", "--help"])
    assert code == 0


def test_an_import_that_fails_inside_a_command_names_the_extras_that_bring_it(monkeypatch, capsys):
    """The fallback for a path the table does not foresee: the command fails with the extras, not a traceback."""
    _without(monkeypatch, "numpy")
    monkeypatch.setattr(extras, "extras_for", lambda arguments: {})
    monkeypatch.delitem(sys.modules, "xlaport.kb.retrieval", raising=False)
    monkeypatch.delitem(sys.modules, "xlaport.kb.minilm", raising=False)
    code, err = _run_main(monkeypatch, capsys, ["kb", "search", "Found no NVIDIA driver"])
    assert code == 2
    assert err.startswith("error: import of numpy halted; None in sys.modules: it is an optional part of xlaport")
    assert "pip install 'xlaport[search]'" in err and "pip install 'xlaport[verify]'" in err


def test_an_error_of_another_module_is_not_blamed_on_an_extra(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["xlaport", "lint", "x.py"])

    def broken(command):
        raise ModuleNotFoundError("No module named 'nothing_of_ours'", name="nothing_of_ours")

    monkeypatch.setattr(cli, "build_app", broken)
    with pytest.raises(ModuleNotFoundError):
        cli.main()


# what a plain lint, fix and migrate import must not: the extras' modules (the core venv has none of them)
EXTRA_ONLY = sorted({m for modules in extras.EXTRA_MODULES.values() for m in modules} - {"pytest"})


def _xlaport(*arguments: str, cwd: Path) -> subprocess.CompletedProcess:
    """`xlaport ARGS` in a fresh interpreter that reports, as its last line, the extras' modules it imported."""
    program = (
        "import json, sys\n"
        "from xlaport.cli import main\n"
        f"sys.argv = ['xlaport', *{list(arguments)!r}]\n"
        "try:\n    main()\n"
        "except SystemExit as stop:\n    code = stop.code\n"
        f"print(json.dumps([m for m in {EXTRA_ONLY!r} if m in sys.modules]))\n"
        "sys.exit(code)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", program], cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )


def test_lint_fix_and_a_plain_migrate_of_an_example_import_no_extra(tmp_path):
    example = tmp_path / "tiny_lm"
    shutil.copytree(EXAMPLES / "tiny_lm", example)
    train = example / "train.py"
    original = train.read_text()

    linted = _xlaport("lint", "--format", "json", str(example), cwd=tmp_path)
    assert linted.returncode == 1, linted.stderr
    *report, imported = linted.stdout.splitlines()
    assert json.loads(imported) == []
    assert "XLA201" in "\n".join(report)

    migrated = _xlaport("migrate", str(example), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert migrated.returncode == 0, migrated.stderr
    assert json.loads(migrated.stdout.splitlines()[-1]) == []
    assert (tmp_path / "out" / "xlaport-report.html").is_file()

    fixed = _xlaport("fix", "--force", str(example), cwd=tmp_path)
    assert json.loads(fixed.stdout.splitlines()[-1]) == []
    assert train.read_text() != original
    assert train.read_text() == (tmp_path / "out" / "train.py").read_text()  # fix and migrate rewrite alike


def test_env_says_which_extras_are_installed(monkeypatch):
    from typer.testing import CliRunner

    _without(monkeypatch, "torch_xla")
    lines = CliRunner().invoke(cli.app, ["env"]).stdout.splitlines()
    assert any(line.startswith("extra [check]: missing ") and "torch_xla" in line for line in lines)
    assert sum(line.startswith("extra [") for line in lines) == len(extras.EXTRA_MODULES)
