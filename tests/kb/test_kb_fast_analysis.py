"""The engine's own traversal, parent map and import tables give every rule exactly what libcst's visitor,
ParentNodeProvider and QualifiedNameProvider gave it: same reports, same order; and every node the same
import-resolved and builtin names."""

import importlib.util
from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import (
    MetadataWrapper,
    ParentNodeProvider,
    PositionProvider,
    QualifiedNameProvider,
    QualifiedNameSource,
)
from xlaport.kb import all_rules
from xlaport.kb.analysis.module import ModuleAnalysis
from xlaport.kb.engine import run_rules
from xlaport.kb.parsing import parse

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = sorted((ROOT / "tests" / "fixtures" / "kb").glob("*/input.py")) + sorted(
    (ROOT / "tests" / "fixtures" / "perf").glob("*.py")
)
# A fixed sample of the performance benchmark's corpus (torch's own nn, optim, distributed: real code with
# lazy imports, shadowed names, `import a.b` next to `import a`), every 40th file.
_TORCH = Path(next(iter(importlib.util.find_spec("torch").submodule_search_locations)))
TORCH_SAMPLE = [p for d in ("nn", "optim", "distributed") for p in sorted((_TORCH / d).rglob("*.py"))][::40]


def _reports(visitors, positions) -> list[tuple]:
    return [
        (v.code, positions[r.node].start.line, positions[r.node].start.column, r.message, r.replacement is None)
        for v in visitors
        for r in v.reports
    ]


def _value(found):
    return found() if callable(found) else found  # QualifiedNameProvider stores LazyValues


def _libcst_names(names, node, source: QualifiedNameSource) -> set[str]:
    return {q.name for q in _value(names.get(node, set())) if q.source is source}


class _Everything:
    def __contains__(self, _: object) -> bool:
        return True


def libcst_reference(source: str) -> list[tuple]:
    module = parse(source)
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    analysis = ModuleAnalysis.of(module, wrapper)
    analysis.parents = dict(wrapper.resolve(ParentNodeProvider))
    names = wrapper.resolve(QualifiedNameProvider)
    analysis.qualified_name_objects = lambda node: _value(names.get(node, set()))
    analysis.has_qualified_names = lambda node: bool(_value(names.get(node, set())))
    analysis.imported_names = lambda node: frozenset(_libcst_names(names, node, QualifiedNameSource.IMPORT))
    builtins = {node: _libcst_names(names, node, QualifiedNameSource.BUILTIN) for node in analysis.parents}
    analysis.names = lambda: type(
        "Builtins",
        (),
        {
            "builtin": lambda _, node: min(builtins.get(node, ()), default=None),
            "imported_heads": _Everything(),  # every name is asked of libcst
        },
    )()
    visitors = [rule() for rule in all_rules()]
    for visitor in visitors:
        visitor.analysis = analysis
    wrapper.visit_batched(visitors)
    return _reports(visitors, wrapper.resolve(PositionProvider))


def engine(source: str) -> list[tuple]:
    module = parse(source)
    visitors = [rule() for rule in all_rules()]
    run_rules(module, visitors)
    return _reports(visitors, MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider))


def test_the_sample_has_findings():
    assert len(SAMPLE) > 100
    assert len(engine((ROOT / "tests" / "fixtures" / "perf" / "scoping.py").read_text())) >= 10


@pytest.mark.parametrize("path", SAMPLE, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_same_reports_as_libcst_metadata(path: Path):
    source = path.read_text()
    assert engine(source) == libcst_reference(source)


@pytest.mark.slow
@pytest.mark.parametrize("path", TORCH_SAMPLE, ids=lambda p: str(p.relative_to(_TORCH)))
def test_same_reports_on_real_code(path: Path):
    source = path.read_text()
    assert engine(source) == libcst_reference(source)


@pytest.mark.parametrize("path", SAMPLE[::5] + TORCH_SAMPLE[::3], ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_node_has_libcst_names(path: Path):
    """The import tables answer for every name, attribute, call and subscript what QualifiedNameProvider does
    (its import and builtin names; rules use no others), fallback included."""
    module = parse(path.read_text())
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    names = wrapper.resolve(QualifiedNameProvider)
    analysis = ModuleAnalysis.of(module, MetadataWrapper(module, unsafe_skip_copy=True))
    checked = 0
    for node in analysis.parents:
        if isinstance(node, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
            assert set(analysis.imported_names(node)) == _libcst_names(names, node, QualifiedNameSource.IMPORT)
            assert set(analysis.qualified_name_objects(node)) == set(_value(names.get(node, set())))
            builtin = analysis.names().builtin(node)
            assert {builtin} - {None} == _libcst_names(names, node, QualifiedNameSource.BUILTIN)
            checked += 1
    assert checked > 10


UNPACKED = """from torch import device, dtype


def to(*args):
    device, dtype, *rest = parse(*args)
    first, (second, dtype) = rest
    return device, dtype, first, second


def sizes(pairs):
    for index, [size, device] in enumerate(pairs):
        print(index, size)


def keep(x, pair):
    device, other = pair
    return x.to(device), (device, other)
"""


def test_names_unpacked_into_need_no_scope_analysis(monkeypatch):
    """A name an unpacking assignment or loop binds (`device, dtype = ...` where `device` is also imported) is
    answered from the import tables as libcst answers it: an assignment of its own, no import."""
    import ast

    import xlaport.kb.analysis.module as module_analysis

    fallbacks = []
    scope_names = module_analysis._scope_names
    monkeypatch.setattr(module_analysis, "_scope_names", lambda *a: fallbacks.append(a) or scope_names(*a))
    module = parse(UNPACKED)
    names = MetadataWrapper(module, unsafe_skip_copy=True).resolve(QualifiedNameProvider)
    analysis = ModuleAnalysis.of(module, None, ast.parse(UNPACKED), UNPACKED)
    targets = 0
    for node in analysis.parents:
        if isinstance(node, cst.Name) and node.value in ("device", "dtype"):
            assert set(analysis.imported_names(node)) == _libcst_names(names, node, QualifiedNameSource.IMPORT)
            assert analysis.has_qualified_names(node) == bool(_value(names.get(node, set())))
            targets += type(analysis.parents[node]) is cst.Element
    assert targets >= 5 and not fallbacks
