"""The engine's own traversal, parent map and on-demand name resolution give every rule exactly what
libcst's visitor, ParentNodeProvider and QualifiedNameProvider gave it: same reports, same order."""

from pathlib import Path

import pytest
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider, QualifiedNameProvider
from xlaport.kb import all_rules
from xlaport.kb.analysis.module import ModuleAnalysis
from xlaport.kb.engine import parse, run_rules

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = sorted((ROOT / "tests" / "fixtures" / "kb").glob("*/input.py")) + sorted(
    (ROOT / "tests" / "fixtures" / "perf").glob("*.py")
)


def _reports(visitors, positions) -> list[tuple]:
    return [
        (v.code, positions[r.node].start.line, positions[r.node].start.column, r.message, r.replacement is None)
        for v in visitors
        for r in v.reports
    ]


def _value(found):
    return found() if callable(found) else found  # QualifiedNameProvider stores LazyValues


def libcst_reference(source: str) -> list[tuple]:
    module = parse(source)
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    analysis = ModuleAnalysis.of(module, wrapper)
    analysis.parents = dict(wrapper.resolve(ParentNodeProvider))
    names = wrapper.resolve(QualifiedNameProvider)
    analysis.qualified_name_objects = lambda node: _value(names.get(node, set()))
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
