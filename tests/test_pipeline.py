"""The migration pipeline: detect → fix → retrieve → propose → validate → patch, on real kb rules."""

import pytest
from xlaport.kb import SourceError, get_rule, lint_source
from xlaport.kb.retrieval import FixIndex, cache_dir
from xlaport.model.proposal import Proposal, Proposer
from xlaport.model.spans import enclosing_function, function_spans
from xlaport.serve.inputs import parse_command
from xlaport.serve.pipeline import RULES_ONLY, Pipeline
from xlaport.serve.results import CheckRun, SuggestOptions, verdict

CUDA_SOURCE = """import torch


def train(model, x):
    model.cuda()
    x = x.to("cuda")
    return model(x)


def peak():
    return torch.cuda.max_memory_allocated()
"""

NO_RETRIEVAL = SuggestOptions(k=0)  # k=0 never loads the embedding model: fast tests


@pytest.fixture(scope="module")
def pipeline():
    return Pipeline(index=FixIndex.load_or_build(directory=cache_dir()))


class ZeroPeak:
    """A stand-in code model: rewrites the function it is asked about, replacing the CUDA memory read."""

    name = "stub"

    def __init__(self, output=None, error=None):
        self.calls = []
        self.output = output
        self.error = error

    def propose(self, source, function_name, findings, retrieved):
        self.calls.append((function_name, [f.code for f in findings], [h["code"] for h in retrieved]))
        if self.error:
            raise self.error
        text = self.output if self.output is not None else source.replace("torch.cuda.max_memory_allocated()", "0")
        return Proposal(function_name=function_name, source=text, rationale="no CUDA allocator on TPU")


def test_rules_fix_what_they_can_and_say_the_patch_is_unvalidated():
    patch = Pipeline().suggest(CUDA_SOURCE, "train.py", NO_RETRIEVAL)
    assert patch.changed
    assert "+    model.to(torch_xla.device())" in patch.diff
    assert patch.diff.startswith("--- a/train.py\n+++ b/train.py\n")
    assert {"XLA201", "XLA202"} <= set(patch.evidence.codes_applied)
    assert [m.finding.code for m in patch.manual] == ["XLA601"]
    assert patch.evidence.model is None
    assert patch.manual[0].function == "peak"
    assert patch.evidence.validated is False and patch.evidence.status == "unvalidated"
    assert patch.evidence.reason == "validation was not requested"
    assert RULES_ONLY in patch.notes
    assert lint_source(patch.migrated, "train.py", [get_rule("XLA201"), get_rule("XLA202")]) == []


def test_validation_not_allowed_is_said_and_nothing_runs():
    options = SuggestOptions(k=0, validate_patch=True)
    patch = Pipeline().suggest(CUDA_SOURCE, None, options, may_execute=False)
    assert patch.path == "snippet.py"
    assert patch.evidence.status == "unvalidated" and not patch.evidence.checks
    assert "not allowed" in patch.evidence.reason


def test_unchanged_source_has_nothing_to_validate():
    patch = Pipeline().suggest("x = 1\n", "a.py", SuggestOptions(k=0, validate_patch=True))
    assert not patch.changed and patch.diff == ""
    assert patch.evidence.reason == "nothing to validate: no changes" and not patch.evidence.checks


def test_unsafe_fixes_only_when_asked():
    rule = get_rule("XLA107")
    assert rule.fix == "unsafe"
    cautious = Pipeline().suggest(rule.before, "env.py", NO_RETRIEVAL)
    assert "XLA107" in cautious.evidence.codes_left and not cautious.changed
    bold = Pipeline().suggest(rule.before, "env.py", SuggestOptions(k=0, unsafe_fixes=True))
    assert "XLA107" in bold.evidence.codes_applied and bold.changed


def test_bad_input_raises_clear_errors():
    with pytest.raises(SourceError, match="cannot parse"):
        Pipeline().suggest("def broken(:\n", "b.py", NO_RETRIEVAL)
    with pytest.raises(ValueError, match="no rule matches"):
        Pipeline().suggest(CUDA_SOURCE, "a.py", SuggestOptions(k=0, select=["NOPE9"]))
    with pytest.raises(ValueError, match="either"):
        Pipeline().check()
    with pytest.raises(SourceError, match="cannot parse"):
        Pipeline().check(source="def broken(:\n")
    with pytest.raises(KeyError):
        Pipeline().explain("XLA000")


def test_select_limits_the_rules():
    patch = Pipeline().suggest(CUDA_SOURCE, "a.py", SuggestOptions(k=0, select=["XLA201"]))
    assert patch.evidence.codes_applied == ["XLA201"]
    assert patch.manual == []


def test_a_proposal_that_fixes_findings_is_applied_and_recorded():
    proposer = ZeroPeak()
    assert isinstance(proposer, Proposer)
    patch = Pipeline(proposer=proposer).suggest(CUDA_SOURCE, "a.py", NO_RETRIEVAL)
    assert proposer.calls == [("peak", ["XLA601"], [])]
    assert "return 0" in patch.migrated and patch.manual == []
    assert patch.evidence.rewritten_functions == ["peak"]
    assert patch.evidence.model == proposer.name  # the patch names the model that served the proposal
    assert RULES_ONLY not in patch.notes
    assert patch.evidence.status == "unvalidated"  # a model's rewrite is never presented as validated unchecked


def test_a_proposal_that_fails_validation_gives_way_to_the_rules_patch(monkeypatch):
    from xlaport.serve.results import with_verdict

    def validate_file(self, original, migrated, name, options, evidence, project=None):
        ok = "return 0" not in migrated  # only the model's rewrite fails its checks
        check = CheckRun(name="generated_tests", passed=ok, reasons=[] if ok else ["peak: 0 != 7"])
        return with_verdict(evidence, [check])

    monkeypatch.setattr(Pipeline, "validate_file", validate_file)
    options = SuggestOptions(k=0, validate_patch=True)
    patch = Pipeline(proposer=ZeroPeak()).suggest(CUDA_SOURCE, "a.py", options)
    assert patch.evidence.status == "validated" and patch.evidence.rewritten_functions == []
    assert patch.evidence.model is None and "return 0" not in patch.migrated
    assert "model.to(torch_xla.device())" in patch.migrated
    assert [m.finding.code for m in patch.manual] == ["XLA601"]
    assert any("rewrite of peak dropped" in n and "peak: 0 != 7" in n for n in patch.notes), patch.notes


@pytest.mark.parametrize(
    ("proposer", "note"),
    [
        (ZeroPeak(output="def broken(:\n"), "does not parse"),
        (ZeroPeak(output=CUDA_SOURCE), "fixes no finding"),
        (ZeroPeak(error=RuntimeError("out of memory")), "no proposal from the code model"),
    ],
)
def test_bad_proposals_are_dropped_and_the_rules_work_is_kept(proposer, note):
    patch = Pipeline(proposer=proposer).suggest(CUDA_SOURCE, "a.py", NO_RETRIEVAL)
    assert any(note in n for n in patch.notes), patch.notes
    assert "model.to(torch_xla.device())" in patch.migrated
    assert [m.finding.code for m in patch.manual] == ["XLA601"]


def test_function_spans_name_methods_and_include_decorators():
    source = "class Trainer:\n    @staticmethod\n    def step(x):\n        return x\n\n\ndef main():\n    pass\n"
    spans = function_spans(source)
    assert spans == [("Trainer.step", 2, 4), ("main", 7, 8)]
    assert enclosing_function(spans, 2) == "Trainer.step"
    assert enclosing_function(spans, 1) == "<module>"


def test_parse_command():
    assert parse_command("python train.py --steps 20") == ("train.py", ["--steps", "20"])
    assert parse_command("train.py") == ("train.py", [])
    assert parse_command("/usr/bin/python3 sub/t.py -x 'a b'") == ("sub/t.py", ["-x", "a b"])
    for bad in ("python", "python -m pkg", "python 'unclosed"):
        with pytest.raises(ValueError):
            parse_command(bad)


def test_verdict():
    passed = CheckRun(name="xla_check", passed=True, level="L2")
    tests_ok = CheckRun(name="generated_tests", passed=True)
    no_tests = CheckRun(name="generated_tests", passed=None, reasons=["no test could be generated"])
    failed = CheckRun(name="xla_check", passed=False, level="L0", reasons=["1 op call(s) fell back to the CPU"])
    assert verdict([passed, tests_ok]) == ("validated", None, "L2")
    status, reason, level = verdict([failed, tests_ok])
    assert status == "rejected" and "fell back" in reason and level == "L0"
    status, reason, _ = verdict([passed, no_tests])
    assert status == "unvalidated" and "no test" in reason
    assert verdict([])[0] == "unvalidated"


@pytest.mark.slow
def test_findings_left_come_with_retrieved_fixes(pipeline):
    patch = pipeline.suggest(CUDA_SOURCE, "train.py", SuggestOptions(k=3))
    (item,) = patch.manual
    assert len(item.retrieved) == 3
    assert item.retrieved[0].code == "XLA601"  # its own entry first
    hits = pipeline.search("x = x.cuda()", 2)
    assert hits[0].code == "XLA201"
    with pytest.raises(ValueError):
        pipeline.search("  ")
    assert pipeline.explain("xla201").entry["code"] == "XLA201"
