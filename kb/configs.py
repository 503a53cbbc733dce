"""Config files and run scripts that name a CUDA device or NCCL (YAML, JSON, TOML, shell).

`device: cuda` in a YAML config or `--device cuda:0` in a run script overrides whatever the migrated
Python code defaults to, so the program still asks for CUDA on a TPU host. These files are read line by
line (comments and layout kept): a CUDA device as the value of a plain YAML key or of a shell flag is
rewritten to `xla`; every other mention (JSON, TOML, lists, `nccl`, `CUDA_VISIBLE_DEVICES`) is reported
on its line for a human.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import PurePath
from typing import ClassVar

from .finding import Finding, FixResult
from .rule import Rule
from .text_edits import text_edits

CONFIG_KINDS = {".yaml": "yaml", ".yml": "yaml", ".json": "json", ".toml": "toml", ".sh": "shell", ".bash": "shell"}
MAX_CONFIG_CHARS = 1_000_000  # larger "configs" are data files
XLA_DEVICE = "xla"  # the device string torch_xla accepts wherever a device string is (`.to("xla")`)

CUDA_DEVICE = r"cuda(?::\d+)?"
# A whole value: `cuda`, `"cuda:0"`, `'cuda'`.
WHOLE_CUDA = re.compile(rf"""(?P<q>["']?)(?P<dev>{CUDA_DEVICE})(?P=q)""")
# A CUDA device anywhere in a value, as a word of its own (not `cuda_version`, not `nvidia-cuda-runtime`).
CUDA_WORD = re.compile(rf"(?<![\w.-]){CUDA_DEVICE}(?![\w.-])")
NCCL_WORD = re.compile(r"(?<![\w.-])nccl(?![\w.-])", re.IGNORECASE)
CUDA_ENV = re.compile(r"\bCUDA_VISIBLE_DEVICES\b")
YAML_KEY = re.compile(r"^(?P<head>\s*(?:-\s+)?(?P<key>[A-Za-z_][\w.-]*)\s*:\s+)(?P<value>.+?)\s*$")
# `--device cuda:0`, `--device=cuda`, `trainer.device=cuda`, `DEVICE=cuda` (the value part is group `dev`).
SHELL_FLAG = re.compile(
    rf"""(?P<head>(?:(?<!\S)--?[\w.-]+(?:=|\s+)|(?<!\S)[\w.]+=))(?P<q>["']?)(?P<dev>{CUDA_DEVICE})(?P=q)(?=\s|;|$|\\)"""
)


def config_kind(path: str | PurePath) -> str | None:
    """The kind ("yaml", "json", "toml", "shell") of a file this module reads; None for any other file."""
    return CONFIG_KINDS.get(PurePath(path).suffix.lower())


class ConfigRule(Rule):
    """A kb entry about non-Python files. Its `before`/`after` are the text of a file named `example_path`."""

    example_path: ClassVar[str]


class CudaDeviceInConfig(ConfigRule):
    code = "XLA240"
    title = "A config file or run script names a CUDA device"
    category = "C2"
    fix = "safe"
    autofix = True
    example_path = "config.yaml"
    detects = (
        "`cuda`, `cuda:N` as a value in YAML, JSON and TOML files and as an argument in shell scripts. The value "
        "of a plain YAML key (`device: cuda`) and of a shell flag (`--device cuda:0`, `--device=cuda`, "
        "`trainer.device=cuda`) is rewritten to `xla`; other occurrences are reported on their line."
    )
    why = (
        "Configuration overrides the code's defaults: the migrated script may pick the XLA device, but a "
        "`device: cuda` in its config or `--device cuda` in its launch script asks for CUDA again, and the run "
        "fails with `Found no NVIDIA driver` or, worse, falls back to the CPU. `xla` is accepted wherever a device "
        "string is (`torch.device('xla')`, `.to('xla')`); each process has one XLA device, so `cuda:1` also "
        "becomes `xla`. Same numbers: only where the program runs changes."
    )
    before = "train:\n  device: cuda:0  # the GPU\n  batch_size: 32\n"
    after = "train:\n  device: xla  # the GPU\n  batch_size: 32\n"
    message = "names a CUDA device; on a TPU host use `xla`"
    symptoms = ("Found no NVIDIA driver on your system", "Torch not compiled with CUDA enabled")
    references = ("pytorch/xla docs: torch_xla.device()",)
    valid = ("train:\n  device: xla\n  cuda_version: 12.1\n",)


class NcclInConfig(ConfigRule):
    code = "XLA740"
    title = "A config file or run script selects NCCL or CUDA devices by environment"
    category = "C7"
    fix = "manual"
    example_path = "run.sh"
    detects = (
        "`nccl` (a process-group backend) in YAML, JSON, TOML and shell files, and `CUDA_VISIBLE_DEVICES` in them."
    )
    why = (
        "NCCL does not exist on a TPU host: `init_process_group('nccl')` fails. The XLA backend is `xla` "
        "(after `import torch_xla.distributed.xla_backend`), or no process group at all with `torch_xla.launch`. "
        "`CUDA_VISIBLE_DEVICES` selects nothing on a TPU host; chips are chosen with `TPU_VISIBLE_CHIPS` "
        "(and `TPU_PROCESS_BOUNDS`), or all of them are used."
    )
    before = "CUDA_VISIBLE_DEVICES=0,1 torchrun --nproc_per_node=2 train.py --backend nccl\n"
    message = "NCCL and CUDA_VISIBLE_DEVICES do nothing on a TPU host; use the `xla` backend / TPU_VISIBLE_CHIPS"
    symptoms = ("Distributed package doesn't have NCCL built in", "ProcessGroupNCCL is only supported with GPUs")
    references = ("pytorch/xla docs: torch.distributed on XLA (xla backend)", "pytorch/xla docs: PJRT runtime")
    valid = ("torchrun --nproc_per_node=4 train.py --backend xla\n",)


@dataclass(frozen=True)
class ConfigHit:
    rule: type[ConfigRule]
    line: int  # 1-based
    column: int  # 1-based
    end_column: int  # 1-based, exclusive: the reported word ends before it (SARIF regions need an end)
    message: str
    fixed_line: str | None = None  # the whole line rewritten (without its line ending), when it can be


def _strip_comment(line: str, kind: str) -> str:
    """The line without a trailing `# ...` comment (YAML, TOML, shell); quotes are respected."""
    if kind == "json":
        return line
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


QUOTED = re.compile(r""""[^"]*"|'[^']*'""")


def _in_prose(code: str, start: int) -> bool:
    """Is position `start` inside a quoted string with spaces (`"runs on cuda"`: a message, not a value)?"""
    return any(q.start() < start < q.end() and any(c.isspace() for c in q.group(0)) for q in QUOTED.finditer(code))


def _device_hits(line: str, number: int, kind: str) -> list[ConfigHit]:
    code = _strip_comment(line, kind)
    words = [w for w in CUDA_WORD.finditer(code) if not _in_prose(code, w.start())]
    if not words:
        return []
    rule = CudaDeviceInConfig
    if kind == "yaml":
        match = YAML_KEY.match(code)
        whole = WHOLE_CUDA.fullmatch(match.group("value")) if match else None
        if match and whole and len(words) == 1:
            start = match.end("head") + whole.start("dev")
            fixed = line[:start] + XLA_DEVICE + line[start + len(whole.group("dev")) :]
            message = f"`{match.group('key')}: {whole.group('dev')}` {rule.message}"
            return [ConfigHit(rule, number, start + 1, start + len(whole.group("dev")) + 1, message, fixed)]
    if kind == "shell":
        flags = list(SHELL_FLAG.finditer(code))
        if flags and len(flags) == len(words):
            fixed = line
            for flag in reversed(flags):
                fixed = fixed[: flag.start("dev")] + XLA_DEVICE + fixed[flag.end("dev") :]
            message = f"`{flags[0].group(0).strip()}` {rule.message}"
            dev = flags[0].span("dev")
            return [ConfigHit(rule, number, dev[0] + 1, dev[1] + 1, message, fixed)]
    word = words[0]
    message = f"`{word.group(0)}` {rule.message} (change it by hand)"
    return [ConfigHit(rule, number, word.start() + 1, word.end() + 1, message)]


def _infrastructure_hits(line: str, number: int, kind: str) -> list[ConfigHit]:
    code = _strip_comment(line, kind)
    found = next((m for m in NCCL_WORD.finditer(code) if not _in_prose(code, m.start())), None)
    found = found or CUDA_ENV.search(code)
    if found is None:
        return []
    message = f"`{found.group(0)}`: {NcclInConfig.message}"
    return [ConfigHit(NcclInConfig, number, found.start() + 1, found.end() + 1, message)]


def scan_config(text: str, path: str) -> list[ConfigHit]:
    """Every CUDA device and NCCL mention in the config file or run script `path` (by its suffix)."""
    kind = config_kind(path)
    if kind is None or len(text) > MAX_CONFIG_CHARS:
        return []
    hits = []
    for number, line in enumerate(text.splitlines(), 1):
        hits += _device_hits(line, number, kind) + _infrastructure_hits(line, number, kind)
    return hits


def _finding(path: str, hit: ConfigHit, lines: list[str] | None = None) -> Finding:
    """`lines`: the file's lines, when the finding is to carry its fix as text edits (lint's JSON and SARIF)."""
    rule = hit.rule
    fixable = hit.fixed_line is not None and rule.fix != "manual"
    edits = ()
    if fixable and lines is not None and 0 < hit.line <= len(lines):
        edits = tuple(
            replace(e, line=hit.line, end_line=hit.line) for e in text_edits(lines[hit.line - 1], hit.fixed_line)
        )
    return Finding(
        path=path,
        line=hit.line,
        column=hit.column,
        end_line=hit.line,
        end_column=hit.end_column,
        code=rule.code,
        category=rule.category,
        title=rule.title,
        message=hit.message,
        fix=rule.fix,
        fixable=fixable,
        edits=edits,
    )


def lint_config(text: str, path: str, codes: set[str] | None = None, edits: bool = False) -> list[Finding]:
    """Findings of the config rules (`codes`: only these) in `text`, the content of `path`; `edits`: each fixable
    finding carries its fix (the line rewritten) as text edits."""
    lines = text.splitlines() if edits else None
    return [_finding(path, h, lines) for h in scan_config(text, path) if codes is None or h.rule.code in codes]


def fix_config(text: str, path: str, codes: set[str] | None = None) -> FixResult:
    """Rewrites what can be rewritten safely; the rest stays as findings. Line endings are kept."""
    hits = [h for h in scan_config(text, path) if codes is None or h.rule.code in codes]
    fixes = {h.line: h for h in hits if h.fixed_line is not None and h.rule.fix == "safe"}
    lines = text.splitlines(keepends=True)
    for number, hit in fixes.items():
        old = lines[number - 1]
        ending = old[len(old.rstrip("\r\n")) :]
        lines[number - 1] = hit.fixed_line + ending
    applied = [_finding(path, h) for h in fixes.values()]
    fixed = "".join(lines)
    return FixResult(path=path, source=text, fixed=fixed, applied=applied, remaining=lint_config(fixed, path, codes))
