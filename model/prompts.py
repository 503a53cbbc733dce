"""The fine-tuning prompt: retrieved fixes + import context + the original function → the migrated function.

    <|fixes|># XLA201: title / # before: ... / # after: ...<|context|>import torch
    <|original|>def f(...): ...<|migrated|>[the edit script: added imports, -old/+new lines]<|endoftext|>

Training (training/dataset.py) and serving (model/proposer.py) build prompts here, so they cannot drift apart.
The markers are special tokens of the tokenizer (training/tokenizer.py), so each is one id.
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Iterable

from xlaport.kb import get_rule
from xlaport.kb.docs import entry_dict

EOS = "<|endoftext|>"
PAD = "<|pad|>"
FIXES = "<|fixes|>"
CONTEXT = "<|context|>"
ORIGINAL = "<|original|>"
MIGRATED = "<|migrated|>"
SPECIAL_TOKENS = [EOS, PAD, FIXES, CONTEXT, ORIGINAL, MIGRATED]

PROMPT_FORMAT = 2  # bump when the layout changes: a model trained on another layout is refused
MAX_FIX_ENTRIES = 2
MAX_SNIPPET_CHARS = 300


def kb_entries(codes: Iterable[str]) -> list[dict]:
    """The kb entries of `codes` (unknown codes are skipped)."""
    entries = []
    for code in dict.fromkeys(codes):
        try:
            entries.append(entry_dict(get_rule(code)))
        except KeyError:
            continue
    return entries


def fixes_text(entries: Iterable[dict], max_entries: int = MAX_FIX_ENTRIES) -> str:
    """Compact text of kb entries for the prompt: code, title, before → after."""
    parts = []
    for entry in list(entries)[:max_entries]:
        part = f"# {entry.get('code', '')}: {entry.get('title', '')}\n"
        before, after = entry.get("before") or "", entry.get("after") or ""
        if before:
            part += "# before:\n" + before[:MAX_SNIPPET_CHARS].rstrip("\n") + "\n"
        if after:
            part += "# after:\n" + after[:MAX_SNIPPET_CHARS].rstrip("\n") + "\n"
        parts.append(part)
    return "".join(parts)


def format_prompt(original: str, imports: str, fixes: str) -> str:
    return f"{FIXES}{fixes}{CONTEXT}{imports}{ORIGINAL}{original}{MIGRATED}"


def prompt_variants(original: str, imports: str, entries: list[dict]) -> list[str]:
    """Prompts from the fullest to the shortest (fewer fixes, then no import context)."""
    variants = [format_prompt(original, imports, fixes_text(entries[:n])) for n in range(MAX_FIX_ENTRIES, -1, -1)]
    variants.append(format_prompt(original, "", ""))
    return list(dict.fromkeys(variants))


# --- target text: added imports + function ---------------------------------------------------
def join_target(added_imports: list[str], function: str) -> str:
    if not added_imports:
        return function
    return "".join(line.rstrip("\n") + "\n" for line in added_imports) + "\n" + function


def split_target(code: str) -> tuple[list[str], str]:
    """(import statements, the rest) of a target or a generated candidate. Raises SyntaxError."""
    tree = ast.parse(code)
    lines = code.splitlines(keepends=True)
    imports: list[str] = []
    rest_start = len(lines)
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imports.append("".join(lines[node.lineno - 1 : node.end_lineno]).strip())
            continue
        decorators = getattr(node, "decorator_list", [])
        rest_start = min([d.lineno for d in decorators] + [node.lineno]) - 1
        break
    return imports, "".join(lines[rest_start:])


# --- the target: an edit script -----------------------------------------------------------------
# The model writes the changes, not the whole function: a small model cannot copy a 200-token
# function faithfully, but it can write the few lines that change. The script is the import lines
# the migration adds, then groups of `-old line` (consecutive lines of the original, found in order)
# followed by `+new line`s that replace them. `apply_edit_script` turns it back into the function.


class EditError(ValueError):
    """An edit script that does not apply to its function."""


def edit_script(original: str, target: str) -> str:
    """The edit script that turns `original` into `target` (added imports + migrated function)."""
    imports, function = split_target(target)
    old, new = original.splitlines(), function.splitlines()
    lines = list(imports)
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        if i1 == i2:  # a pure insertion: anchor it on a neighbouring line, which is kept
            if i1 > 0:
                lines += ["-" + old[i1 - 1], "+" + old[i1 - 1], *("+" + line for line in new[j1:j2])]
            else:
                lines += ["-" + old[0], *("+" + line for line in new[j1:j2]), "+" + old[0]]
            continue
        if j1 == j2:  # a pure deletion: keep a neighbouring line, so the next group does not merge into it
            if i2 < len(old):
                lines += ["-" + line for line in old[i1 : i2 + 1]] + ["+" + old[i2]]
            else:
                lines += ["-" + line for line in old[i1 - 1 : i2]] + ["+" + old[i1 - 1]]
            continue
        lines += ["-" + line for line in old[i1:i2]] + ["+" + line for line in new[j1:j2]]
    return "".join(line + "\n" for line in lines)


def apply_edit_script(original: str, script: str) -> tuple[list[str], str]:
    """(added import lines, the edited function). Raises EditError when the script does not fit."""
    imports: list[str] = []
    groups: list[tuple[list[str], list[str]]] = []
    for line in script.splitlines():
        if line.startswith("-"):
            if not groups or groups[-1][1]:
                groups.append(([], []))
            groups[-1][0].append(line[1:])
        elif line.startswith("+"):
            if not groups:
                raise EditError("a `+` line comes before any `-` line")
            groups[-1][1].append(line[1:])
        elif line.strip():
            if groups:
                raise EditError(f"a line that is neither an edit nor an import: {line.strip()[:60]!r}")
            imports.append(line.strip())
    lines = original.splitlines()
    out: list[str] = []
    cursor = 0
    for old, new in groups:
        at = next(
            (k for k in range(cursor, len(lines) - len(old) + 1) if lines[k : k + len(old)] == old),
            None,
        )
        if at is None:
            raise EditError(f"the edit does not match the function: -{old[0].strip()[:60]}")
        out += lines[cursor:at] + new
        cursor = at + len(old)
    out += lines[cursor:]
    return imports, "".join(line + "\n" for line in out)
