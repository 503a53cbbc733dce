"""The lint configuration: `[tool.xlaport]` in pyproject.toml, or `.xlaport.toml` / `xlaport.toml` (top-level keys or
`[tool.xlaport]`), found from the folder of the paths given upwards, the first of those three files in each folder
(ruff's order). `xlaport lint` and `xlaport fix` read it; `--config FILE` names one, `--isolated` reads none.

    [tool.xlaport]
    select = ["XLA2", "C4"]          # codes, code prefixes, categories (C1..C7) or "ALL"; default: every rule
    extend-select = ["XLA701"]       # added to select (also to the default)
    ignore = ["XLA406"]
    exclude = ["legacy", "scripts/*.py"]              # globs, relative to the config's folder
    per-file-ignores = {"tests/*" = ["XLA2"], "conftest.py" = ["ALL"]}
    unsafe-fixes = false

ruff's semantics: the configuration and then the command line are layers; a layer with `select` starts again from
nothing, its `extend-select` adds and its `ignore` removes, and within a layer the most specific selector that
matches a rule decides (a code over a prefix over a category over `XLA` over ALL; `ignore` wins a tie). So `select = ["XLA"]`
with `ignore = ["XLA2"]` leaves XLA2 out, and `--select XLA201` on the command line replaces the configured
selection. `exclude` applies to files found by walking a folder; a file named on the command line is linted
anyway unless `--force-exclude` (as pre-commit's hooks pass). The folders xlaport always skips (.git, .venv,
__pycache__, ...) stay skipped. A glob without `/` matches a file or folder of that name anywhere; one with `/` the
path from the config's folder (`*` also crosses `/`). `per-file-ignores` turns rules off for the files its globs
match: no findings and no fixes there. Settings of verify live in `[tool.xlaport.verify]` (eval/verify/config.py).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath
from typing import Any

from .rule import Rule

CONFIG_FILES = (".xlaport.toml", "xlaport.toml", "pyproject.toml")
LIST_KEYS = ("select", "extend-select", "ignore", "exclude", "extend-exclude")
KNOWN_KEYS = frozenset({*LIST_KEYS, "per-file-ignores", "unsafe-fixes"})
SUBTABLES = frozenset({"verify"})  # other commands' settings, read where they are used
ALL = "ALL"


class ConfigError(ValueError):
    """A configuration that cannot be used: bad TOML, an unknown key, a value of the wrong type."""


@dataclass(frozen=True)
class Selection:
    """One layer of rule selection: the configuration's, or the command line's."""

    select: tuple[str, ...] | None = None  # None: keep what the layer below chose
    extend_select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()

    def selectors(self) -> list[str]:
        return [*(self.select or ()), *self.extend_select, *self.ignore]


@dataclass(frozen=True)
class LintSettings:
    selection: Selection = field(default_factory=Selection)
    exclude: tuple[str, ...] = ()
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (glob, selectors) in the file's order
    unsafe_fixes: bool = False
    root: Path | None = None  # the config's folder: globs are relative to it
    source: Path | None = None  # the file they were read from; None: defaults


def find_config(start: Path, within: Path | None = None) -> Path | None:
    """The configuration that governs `start` (a folder): the first config file in it or its parents (none above
    `within`, when given: a server reads nothing outside the folder it was given); a pyproject.toml counts only
    with a [tool.xlaport] table."""
    for folder in (start, *start.parents):
        if within is not None and not folder.is_relative_to(within):
            break
        for name in CONFIG_FILES:
            path = folder / name
            if path.is_file() and (name != "pyproject.toml" or _table(path) is not None):
                return path
    return None


def _load_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: cannot be read as TOML ({exc})") from None


def _table(path: Path) -> dict[str, Any] | None:
    """The lint table of a config file: [tool.xlaport], or (in xlaport.toml / .xlaport.toml) the top-level keys."""
    data = _load_toml(path)
    table = data.get("tool", {}).get("xlaport")
    if table is None and path.name != "pyproject.toml":
        table = {k: v for k, v in data.items() if k != "tool"}
    return table


def read_settings(path: Path) -> LintSettings:
    """The settings of one config file; raises ConfigError for an unknown key or a value of the wrong type."""
    table = _table(path) or {}
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key in SUBTABLES:
            continue
        if key.replace("_", "-") not in KNOWN_KEYS:
            raise ConfigError(f"{path}: unknown key {key!r} (known: {', '.join(sorted(KNOWN_KEYS))})")
        values[key.replace("_", "-")] = value
    for key in LIST_KEYS:
        if key in values and not _is_strings(values[key]):
            raise ConfigError(f"{path}: {key} must be a list of strings, not {values[key]!r}")
    per_file = values.get("per-file-ignores", {})
    if not isinstance(per_file, dict) or not all(_is_strings(v) for v in per_file.values()):
        raise ConfigError(f"{path}: per-file-ignores must map globs to lists of codes, not {per_file!r}")
    unsafe = values.get("unsafe-fixes", False)
    if not isinstance(unsafe, bool):
        raise ConfigError(f"{path}: unsafe-fixes must be true or false, not {unsafe!r}")
    select = values.get("select")
    return LintSettings(
        selection=Selection(
            select=None if select is None else tuple(select),
            extend_select=tuple(values.get("extend-select", ())),
            ignore=tuple(values.get("ignore", ())),
        ),
        exclude=(*values.get("exclude", ()), *values.get("extend-exclude", ())),
        per_file_ignores=tuple((glob, tuple(codes)) for glob, codes in per_file.items()),
        unsafe_fixes=unsafe,
        root=path.resolve().parent,
        source=path,
    )


def load_settings(paths: Sequence[Path], config: Path | None = None, isolated: bool = False) -> LintSettings:
    """The settings for a run over `paths`: from `config` when given, none when `isolated`, else the config
    found from the folder that holds all of `paths` (the current folder when none is given)."""
    if isolated:
        return LintSettings()
    if config is not None:
        if not config.is_file():
            raise ConfigError(f"{config}: no such configuration file")
        return read_settings(config)
    found = find_config(_common_folder(paths))
    return read_settings(found) if found else LintSettings()


def _common_folder(paths: Sequence[Path]) -> Path:
    folders = [str(p.resolve() if p.is_dir() else p.resolve().parent) for p in paths] or [os.getcwd()]
    return Path(os.path.commonpath(folders))


def _is_strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


# --- which rules --------------------------------------------------------------------------------------------------
def _specificity(selector: str) -> float:
    """How narrow a selector is: ALL < a family (`XLA`, `TPU`) < a category (C1..C7) < a longer code prefix."""
    if selector == ALL:
        return 0
    if selector.startswith("C") and selector[1:].isdigit():
        return 3.5
    return len(selector)


def _matches(rule: type[Rule], selector: str) -> bool:
    return selector == ALL or rule.code.startswith(selector) or rule.category == selector


def choose_rules(rules: Sequence[type[Rule]], layers: Sequence[Selection]) -> list[type[Rule]]:
    """The rules that the selection layers (the configuration's, then the command line's) leave on; every rule
    when no layer selects. Raises KeyError naming a selector that matches no rule (a typo must not pass)."""
    unknown = [s for layer in layers for s in layer.selectors() if not any(_matches(r, s.upper()) for r in rules)]
    if unknown:
        raise KeyError(f"no rule matches {', '.join(dict.fromkeys(unknown))}")
    enabled = {r.code for r in rules}
    for layer in layers:
        decides = [(s.upper(), True) for s in (*(layer.select or ()), *layer.extend_select)]
        decides += [(s.upper(), False) for s in layer.ignore]
        before = set() if layer.select is not None else enabled
        enabled = set()
        for rule in rules:
            # (specificity, is an ignore): the highest decides, so an ignore wins a tie
            matching = [(_specificity(s), not on) for s, on in decides if _matches(rule, s)]
            if matching:
                if not max(matching)[1]:
                    enabled.add(rule.code)
            elif rule.code in before:
                enabled.add(rule.code)
    return [r for r in rules if r.code in enabled]


# --- which files ---------------------------------------------------------------------------------------------------
def _relative(path: Path, root: Path | None) -> PurePosixPath:
    resolved = Path(os.path.abspath(path))
    if root is not None and resolved.is_relative_to(root):
        return PurePosixPath(resolved.relative_to(root).as_posix())
    return PurePosixPath(resolved.as_posix())


def glob_matches(glob: str, path: Path, root: Path | None) -> bool:
    """Whether `glob` (ruff's exclude / per-file-ignores syntax) names `path` or a folder above it."""
    relative = _relative(path, root)
    glob = glob.removeprefix("./").rstrip("/")
    if "/" not in glob:  # a name: a file or folder of that name, anywhere
        return any(fnmatchcase(part, glob) for part in relative.parts)
    return any(
        fnmatchcase(PurePosixPath(*relative.parts[:n]).as_posix(), glob) for n in range(1, len(relative.parts) + 1)
    )


def is_excluded(path: Path, settings: LintSettings) -> bool:
    return any(glob_matches(glob, path, settings.root) for glob in settings.exclude)


def ignored_codes(path: Path, settings: LintSettings, rules: Sequence[type[Rule]]) -> tuple[str, ...]:
    """The codes of `rules` that per-file-ignores turns off for `path`."""
    selectors = [
        s.upper() for glob, codes in settings.per_file_ignores if glob_matches(glob, path, settings.root) for s in codes
    ]
    return tuple(r.code for r in rules if any(_matches(r, s) for s in selectors))


def check_per_file_selectors(settings: LintSettings, rules: Sequence[type[Rule]]) -> None:
    """Raises KeyError for a per-file-ignores code that matches no rule."""
    unknown = [
        s for _, codes in settings.per_file_ignores for s in codes if not any(_matches(r, s.upper()) for r in rules)
    ]
    if unknown:
        raise KeyError(f"per-file-ignores: no rule matches {', '.join(dict.fromkeys(unknown))}")
