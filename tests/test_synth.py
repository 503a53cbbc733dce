"""Synthesized manual-finding pairs (training/synth.py): each kind injects a CUDA-ism the kb reports
as manual, the target is its XLA form, and the edit script between them round-trips."""

import random

import pytest
from xlaport.kb import lint_source
from xlaport.model.prompts import apply_edit_script, edit_script, split_target
from xlaport.training.corpus import Function, split_of
from xlaport.training.synth import KINDS, synth_edits, synth_traces

IMPORTS = "import torch\nimport torch.nn.functional as F\n"

# written for these tests, in the shape of a classifier's training function
TRAIN = '''def fit(args, model, loader, optimizer):
    """One epoch."""
    model.train()
    for step, (x, y) in enumerate(loader):
        optimizer.zero_grad()
        out = model(x)
        loss = F.cross_entropy(out, y)
        loss.backward()
        optimizer.step()
    return model
'''

FORWARD = """def forward(self, x):
    logits = self.proj(torch.tanh(x))
    return logits.softmax(-1)
"""

MANUAL_CODES = {
    "host_read": {"XLA401", "XLA402", "XLA403", "XLA404"},
    "event_timing": {"XLA208"},
    "memory_stats": {"XLA601"},
    "masked": {"XLA409", "XLA411"},
    "grad_scaler": {"XLA502"},
}


def _codes(source: str) -> set[str]:
    return {f.code for f in lint_source(IMPORTS + "\n" + source)}


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_kind_injects_a_manual_finding_that_its_target_does_not_have(kind):
    fn = Function(file="repo/train.py", name="fit", source=FORWARD if kind == "masked" else TRAIN, imports=IMPORTS)
    edits = [edit for k, edit in synth_edits(fn, random.Random(0)) if k == kind]
    assert edits, f"{kind} found no place in the function"
    for original, target, added_imports in edits:
        assert _codes(original) & MANUAL_CODES[kind], original
        assert not (_codes("\n".join(added_imports) + "\n" + target) & MANUAL_CODES[kind]), target
        script = edit_script(
            original, "".join(i + "\n" for i in added_imports) + ("\n" if added_imports else "") + target
        )
        imports, function = apply_edit_script(original, script)
        assert imports == added_imports and function == target


def test_grad_scaler_target_is_the_plain_function():
    fn = Function(file="repo/train.py", name="fit", source=TRAIN, imports=IMPORTS)
    original, target, _ = next(edit for kind, edit in synth_edits(fn, random.Random(1)) if kind == "grad_scaler")
    assert "GradScaler(" in original and "enabled=args.amp" in original
    assert "scaler.scale(loss).backward()" in original and "scaler.update()" in original
    assert target == TRAIN


def test_synth_traces_are_deduplicated_split_by_file_and_carry_their_codes():
    functions = [
        Function(file=f"repo/file{n}.py", name="fit", source=TRAIN.replace("fit", f"fit{n}"), imports=IMPORTS)
        for n in range(6)
    ]
    functions.append(functions[0])  # a copy adds nothing
    traces = synth_traces(functions, limit=200, seed=0)
    originals = [t.original for t in traces]
    assert len(originals) == len(set(originals))
    assert {t.kind for t in traces} >= {"synth:host_read", "synth:grad_scaler", "synth:event_timing"}
    for trace in traces:
        assert trace.split == split_of(trace.file)
        assert trace.codes and set(trace.codes) <= _codes(trace.original)
        split_target(trace.target)  # parses
    assert len(synth_traces(functions, limit=3, seed=0)) == 3


def test_held_out_fixtures_have_manual_findings_that_their_expected_form_resolves():
    from pathlib import Path

    root = Path(__file__).parent / "fixtures" / "model_heldout"
    cases = sorted(p for p in root.iterdir() if p.is_dir())
    assert len(cases) >= 8
    for case in cases:
        # left by the default (safe) fixes: what the pipeline hands the model (unsafe fixes are opt-in)
        before = [f for f in lint_source((case / "input.py").read_text()) if not (f.fixable and f.fix == "safe")]
        after = {f.code for f in lint_source((case / "expected.py").read_text()) if not (f.fixable and f.fix == "safe")}
        assert before, f"{case.name}: no finding the default fixes leave in input.py"
        assert not ({f.code for f in before} & after), f"{case.name}: expected.py keeps {after}"
