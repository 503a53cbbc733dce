"""What bench/repo_tests.py and bench/zero_edit.py share: the manifest of public repositories, where their
snapshots lie, and the environment their code runs in.

The environment is a venv layered on the project's .venv (its site-packages underneath, so torch and torch_xla
are the pinned ones) with each repository's own dependencies installed on top; it is made once and reused.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "bench" / "unseen_repos.toml"
DEFAULT_CORPUS = Path("/work/corpus")
DEFAULT_ENV = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "xlaport" / "bench-env"


@dataclass(frozen=True)
class Repo:
    name: str
    tests: list[str]
    deps: list[str] = field(default_factory=list)
    timeout_s: float = 900
    sample: int = 1  # run every N-th collected test (a suite of thousands of parametrized cases on 2 cores)


@dataclass(frozen=True)
class Program:
    repo: str
    script: str
    cwd: str = "."  # where a user stands to run it, relative to the repository
    args: list[str] = field(default_factory=list)
    module: str | None = None  # run as `python -m MODULE` from cwd (`script` is then the module's file)
    data: str | list[str] | None = None  # KIND:PATH of bench/unseen_data.py, or several
    max_steps: int = 30
    deps: list[str] = field(default_factory=list)
    timeout_s: float = 600
    # variables a user sets in the shell before running it (WANDB_MODE=disabled without a wandb account)
    env: dict[str, str] = field(default_factory=dict)
    # options of `xlaport check` a user adds for this program (`--project ..` when its data lies beside the clone)
    check_args: list[str] = field(default_factory=list)


def load_manifest(path: Path = MANIFEST) -> tuple[list[Repo], list[Program]]:
    data = tomllib.loads(path.read_text())
    repos = [Repo(**entry) for entry in data.get("repo", [])]
    programs = [Program(**entry) for entry in data.get("program", [])]
    return repos, programs


def snapshot_dir(corpus: Path, name: str) -> Path:
    """A repository's extracted snapshot: corpus/OWNER__NAME."""
    return corpus / name.replace("/", "__")


PINNED_STACK = ("torch", "torchvision", "torch_xla")


def _base_version(distribution: str) -> str:
    """The installed version without its local part (2.9.0+cu128 -> 2.9.0), as a pip constraint takes it."""
    return importlib.metadata.version(distribution).split("+")[0]


def bench_python(deps: list[str], env_dir: Path = DEFAULT_ENV) -> Path:
    """The interpreter of the layered environment, with `deps` installed (made or extended on demand)."""
    python = env_dir / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
        # every site-packages this interpreter sees, in order: a worktree's thin venv reaches main's packages
        # through a .pth line, and a path a .pth line adds is not processed again as a site dir
        base = "\n".join(p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir())
        site = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        Path(site, "_xlaport_base.pth").write_text(base + "\n")
    _install_synthetic_trust(python)
    own = env_dir / ".xlaport-editable"
    if not own.exists() or own.read_text() != str(
        ROOT
    ):  # this checkout's xlaport, so `python -m xlaport check` runs the child with these deps
        subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                "-e",
                str(ROOT),
            ],
            check=True,
        )
        own.write_text(str(ROOT))
    wanted = sorted(set(deps))
    stamp = env_dir / f".deps-{hashlib.sha256(' '.join(wanted).encode()).hexdigest()[:12]}"
    if wanted and not stamp.exists():
        # a dependency asking for a newer torch must not replace the pinned stack underneath (pip would
        # install a whole new torch into the layer): such a requirement fails to resolve instead
        pins = env_dir / "pinned-stack.txt"
        pins.write_text("".join(f"{name}=={_base_version(name)}\n" for name in PINNED_STACK))
        command = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-c", str(pins)]
        subprocess.run([*command, *wanted], check=True)
        stamp.touch()
    return python


def _install_synthetic_trust(python: Path) -> None:
    """bench/synthetic_trust.py in the environment, loaded at start-up (md5-checked loaders accept our data)."""
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    source = Path(__file__).resolve().parent / "synthetic_trust.py"
    Path(site, "_xlaport_synthetic_trust.py").write_text(source.read_text())
    Path(site, "_xlaport_synthetic_trust.pth").write_text("import _xlaport_synthetic_trust\n")


def xlaport_command(python: Path | str = sys.executable) -> list[str]:
    """The `xlaport` command of this checkout, as a user runs it (its checks run children with `python`)."""
    return [str(python), "-m", "xlaport"]


class CheckedProgram(Protocol):
    """What `check_report` reads of a program (unseen_repos.toml's, or model_findings.toml's in model_evidence.py)."""

    script: str
    cwd: str
    args: Sequence[str]
    max_steps: int
    timeout_s: float


def check_report(python: Path | str, tree: Path, program: CheckedProgram) -> tuple[dict | None, str | None]:
    """`xlaport check --format json` of the program's script in `tree`, run from its working folder as a user would:
    (the report, None), or (None, why there is none)."""
    cwd = tree / program.cwd
    command = [*xlaport_command(python), "check", "--format", "json"]
    command += ["--max-steps", str(program.max_steps), "--timeout", str(program.timeout_s)]
    for name, value in getattr(program, "env", {}).items():  # the run sees only an allowlist of ours
        command += ["--env", f"{name}={value}"]
    command += getattr(program, "check_args", [])
    module = getattr(program, "module", None)
    command += ["-m", module] if module else [os.path.relpath(tree / program.script, cwd)]
    if program.args:
        command += ["--", *program.args]
    done = subprocess.run(command, cwd=cwd, env={**os.environ, "PJRT_DEVICE": "CPU"}, capture_output=True, text=True)
    try:
        return json.loads(done.stdout), None
    except json.JSONDecodeError:
        return None, f"check gave no report ({done.returncode}): {done.stderr[-800:]}"
