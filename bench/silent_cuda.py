"""What CUDA is left after a migration, and does a finding say so? Silent leftovers are the ones nobody is told about.

    .venv/bin/python bench/silent_cuda.py MIGRATED_DIR [MIGRATED_DIR ...] [--json out.json] [--show]

For every Python file of each migrated tree (the output of `xlaport migrate`), every token that names CUDA is a
leftover: an identifier or attribute spelling `cuda` (`torch.cuda`, `.cuda(`, `use_cuda`, `is_cuda`) or a string
holding `cuda` or `nccl`. A leftover is *reported* when a finding of `xlaport lint` on that file covers its line
(from the finding's line to its end line), else *silent*. Many silent leftovers are harmless (a guard that is
false on a TPU host, a user flag named `--cuda`): the number is what a reader must check by hand, not a count of
bugs. A benchmark, not a test: it prints a table and JSON and exits 0.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import re
import sys
import tokenize
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from xlaport.kb import lint_source  # noqa: E402

CUDA_WORD = re.compile(r"cuda|nccl", re.IGNORECASE)


@dataclass
class TreeLeftovers:
    tree: str
    files: int = 0
    leftovers: int = 0
    silent: int = 0
    silent_lines: list[str] = field(default_factory=list)  # "path:line: text"


def _text_lines(source: str) -> set[int]:
    """Lines of strings that stand alone as statements (docstrings): prose, not code."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return lines


def cuda_tokens(source: str) -> list[int]:
    """Lines of the tokens that name CUDA (comments and docstrings are not code and are skipped)."""
    lines = []
    try:
        prose = _text_lines(source)
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type in (tokenize.NAME, tokenize.STRING) and CUDA_WORD.search(tok.string):
                if tok.start[0] not in prose:
                    lines.append(tok.start[0])
    except (tokenize.TokenError, SyntaxError):
        return []
    return lines


def covered_lines(source: str, name: str) -> set[int]:
    covered: set[int] = set()
    for finding in lint_source(source, name):
        covered.update(range(finding.line, (finding.end_line or finding.line) + 1))
    return covered


def measure(tree: Path) -> TreeLeftovers:
    result = TreeLeftovers(str(tree))
    for path in sorted(tree.rglob("*.py")):
        if any(part.startswith(".") for part in path.relative_to(tree).parts):
            continue
        source = path.read_text(encoding="utf-8", errors="replace")
        lines = cuda_tokens(source)
        result.files += 1
        if not lines:
            continue
        covered = covered_lines(source, str(path))
        text = source.splitlines()
        for line in sorted(set(lines)):
            result.leftovers += 1
            if line not in covered:
                result.silent += 1
                result.silent_lines.append(f"{path.relative_to(tree)}:{line}: {text[line - 1].strip()[:100]}")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", type=Path)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--show", action="store_true", help="list every silent line")
    args = parser.parse_args()
    results = [measure(tree) for tree in args.trees]
    print(f"{'tree':60} {'files':>5} {'CUDA lines':>10} {'silent':>6}")
    for r in results:
        print(f"{Path(r.tree).name[:60]:60} {r.files:>5} {r.leftovers:>10} {r.silent:>6}")
        if args.show:
            for line in r.silent_lines:
                print(f"    {line}")
    total, silent = sum(r.leftovers for r in results), sum(r.silent for r in results)
    print(f"\nCUDA lines left: {total}; silent (no finding on the line): {silent}")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
