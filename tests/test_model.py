"""The code model at serving time: loading, the adapter round trip, candidate checks, the pipeline hand-off."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner
from xlaport.model.artifacts import write_meta
from xlaport.model.prompts import PROMPT_FORMAT
from xlaport.model.proposer import (
    CodeModel,
    ModelNotUsable,
    ProposalRejected,
    add_imports,
    check_candidate,
    load_proposer,
    no_model_message,
)
from xlaport.training.configs import get_size

CORPUS = Path(__file__).parent / "fixtures" / "training_corpus" / "corpus"
ORIGINAL = "def report(self, x):\n    used = torch.cuda.memory_allocated()\n    return x * 2, used\n"


# --- candidate checks (no model needed) --------------------------------------------------------------
def test_check_candidate_accepts_a_rewrite_and_splits_its_imports():
    generated = "import torch_xla.core.xla_model as xm\n\ndef report(self, x):\n    used = xm.get_memory_info()\n    return x * 2, used\n"
    imports, function = check_candidate(ORIGINAL, generated)
    assert imports == ["import torch_xla.core.xla_model as xm"]
    assert function.startswith("def report(self, x):") and "get_memory_info" in function


@pytest.mark.parametrize(
    ("generated", "reason"),
    [
        ("def report(self, x):\n    return (x *\n", "does not parse"),
        ("def report(self, x, y):\n    return x\n", "changes the signature"),
        ("def reported(self, x):\n    return x\n", "changes the signature"),
        ("async def report(self, x):\n    return x\n", "changes the signature"),
        ("def report(self, x) -> int:\n    return x\n", "changes the signature"),
        ("x = 1\n", "not exactly one function"),
        ("def report(self, x):\n    return x\n\ndef extra():\n    pass\n", "not exactly one function"),
        (ORIGINAL, "changes nothing"),
    ],
)
def test_check_candidate_rejects_with_the_reason(generated, reason):
    with pytest.raises(ProposalRejected, match=reason):
        check_candidate(ORIGINAL, generated)


def test_add_imports_goes_after_the_docstring_and_imports_and_skips_present_ones():
    source = '"""Doc."""\nimport torch\nimport torch_xla\n\nX = 1\n'
    result = add_imports(source, ["import torch_xla", "import torch_xla.core.xla_model as xm"])
    assert result == '"""Doc."""\nimport torch\nimport torch_xla\nimport torch_xla.core.xla_model as xm\n\nX = 1\n'
    assert add_imports("X = 1\n", ["import os"]) == "import os\nX = 1\n"
    assert add_imports(source, []) == source


# --- finding a model ---------------------------------------------------------------------------------
def test_no_model_means_rules_only_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("XLAPORT_MODELS_DIR", str(tmp_path))
    monkeypatch.delenv("XLAPORT_MODEL", raising=False)
    assert load_proposer() is None
    assert "rules-only" in no_model_message() and str(tmp_path) in no_model_message()
    with pytest.raises(ModelNotUsable, match="not found"):
        load_proposer(tmp_path / "missing")
    with pytest.raises(ModelNotUsable, match="neither an xlaport LoRA model nor a peft adapter"):
        load_proposer(tmp_path)
    old = tmp_path / "lora-old"
    old.mkdir()
    write_meta(old, {"kind": "lora", "base_model": str(tmp_path), "prompt_format": PROMPT_FORMAT + 1})
    with pytest.raises(ModelNotUsable, match="prompt format"):
        load_proposer(old)


# --- a tiny real model ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A tiny random-init base + LoRA adapter (non-zero B, so the adapter changes the logits), saved like `train lora`."""
    from peft import LoraConfig, get_peft_model
    from xlaport.training.tokenizer import train_tokenizer
    from xlaport.training.workflow import lora_settings, new_base_model

    size = get_size("tiny")
    root = tmp_path_factory.mktemp("models")
    base_dir, lora_dir = root / "base-tiny", root / "lora-tiny"
    tokenizer = train_tokenizer([p.read_text() for p in sorted(CORPUS.glob("*.py"))], vocab_size=400)
    torch.manual_seed(0)
    base = new_base_model(size, tokenizer)
    base.save_pretrained(str(base_dir))
    tokenizer.save_pretrained(str(base_dir))
    model = get_peft_model(base, LoraConfig(task_type="CAUSAL_LM", **lora_settings(size, "llama")))
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.5)
    model.save_pretrained(str(lora_dir))
    tokenizer.save_pretrained(str(lora_dir))
    write_meta(
        lora_dir,
        {
            "kind": "lora",
            "base_model": str(base_dir),
            "prompt_format": PROMPT_FORMAT,
            "context": size.context,
            "max_new_tokens": 24,
        },
    )
    probe = tokenizer("def f(x):\n    return x.cuda()\n", return_tensors="pt").input_ids
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=probe).logits
        with model.disable_adapter():
            base_logits = model(input_ids=probe).logits
    return {"dir": lora_dir, "probe": probe, "logits": logits, "base_logits": base_logits}


def test_migrate_http_and_mcp_use_the_model_only_when_configured(tiny_model, monkeypatch):
    """A trained adapter in the models dir serves `xlaport suggest`; migrate/HTTP/MCP need $XLAPORT_MODEL."""
    from xlaport.serve.pipeline import load_default_proposer

    monkeypatch.setenv("XLAPORT_MODELS_DIR", str(tiny_model["dir"].parent))
    monkeypatch.delenv("XLAPORT_MODEL", raising=False)
    assert load_default_proposer() is None
    suggest_model = load_proposer()
    assert suggest_model is not None and suggest_model.model_dir == tiny_model["dir"].resolve()
    monkeypatch.setenv("XLAPORT_MODEL", str(tiny_model["dir"]))
    assert load_default_proposer() is suggest_model  # loaded once per process


@pytest.mark.slow
def test_adapter_save_and_load_round_trip_gives_identical_logits(tiny_model):
    model = CodeModel(tiny_model["dir"])
    with torch.no_grad():
        logits = model.model(input_ids=tiny_model["probe"]).logits
    assert torch.equal(logits, tiny_model["logits"])
    assert not torch.equal(logits, tiny_model["base_logits"]), "the adapter is really applied"


@pytest.mark.slow
def test_generation_is_greedy_bounded_and_cached_per_process(tiny_model):
    proposer = load_proposer(tiny_model["dir"])
    assert load_proposer(tiny_model["dir"]) is proposer
    first = proposer.candidate(ORIGINAL, "import torch\n", ["XLA601"], "report")
    second = proposer.candidate(ORIGINAL, "import torch\n", ["XLA601"], "report")
    assert first.raw == second.raw and first.new_tokens == second.new_tokens
    assert 0 < first.new_tokens <= 24
    # a random adapter writes no valid rewrite: rejected with a reason, never handed on
    assert first.code is None and first.rejected_reason


class ScriptedModel(CodeModel):
    """The real model, tokenizer, prompt, checks and splicing; only the generated text is fixed."""

    def __init__(self, model_dir: Path, completions: list[str]) -> None:
        super().__init__(model_dir)
        self.completions = completions
        self.prompts: list[str] = []

    def generate_text(self, prompt_ids, budget):
        self.prompts.append(self.tokenizer.decode(prompt_ids))
        return self.completions.pop(0), True, 10


SCRIPT = textwrap.dedent(
    '''
    """A module."""
    import torch


    class Net:
        def report(self, x):
            used = torch.cuda.memory_allocated()
            return x * 2, used
    '''
).lstrip()


@pytest.mark.slow
def test_accepted_and_rejected_candidates_reach_the_pipeline(tiny_model):
    from xlaport.serve.pipeline import Pipeline

    good = "import torch_xla.core.xla_model as xm\n-    used = torch.cuda.memory_allocated()\n+    used = xm.get_memory_info()\n"
    bad = "-def report(self, x):\n+def report(self, x, device):\n"
    stray = "-    used = torch.cuda.max_memory_allocated()\n+    used = 0\n"
    proposer = ScriptedModel(tiny_model["dir"], [good, bad, stray])
    pipeline = Pipeline(proposer=proposer)

    accepted = pipeline.suggest(SCRIPT, "net.py")
    assert "XLA601" in proposer.prompts[0] and "used = torch.cuda.memory_allocated()" in proposer.prompts[0]
    assert accepted.evidence.rewritten_functions == ["Net.report"]
    assert "XLA601" not in [m.finding.code for m in accepted.manual]
    assert accepted.migrated == (
        '"""A module."""\nimport torch\nimport torch_xla.core.xla_model as xm\n\n\nclass Net:\n'
        "    def report(self, x):\n        used = xm.get_memory_info()\n        return x * 2, used\n"
    )

    rejected = pipeline.suggest(SCRIPT, "net.py")
    assert rejected.evidence.rewritten_functions == []
    assert rejected.migrated == SCRIPT, "the rules' result is kept"
    assert any("Net.report" in note and "changes the signature" in note for note in rejected.notes), rejected.notes

    stray_patch = pipeline.suggest(SCRIPT, "net.py")
    assert stray_patch.migrated == SCRIPT
    assert any("the edit script does not apply" in note for note in stray_patch.notes), stray_patch.notes


@pytest.mark.slow
def test_suggest_cli_shows_the_model_and_says_when_it_runs_rules_only(tiny_model, tmp_path, monkeypatch):
    from xlaport.cli import app

    script = tmp_path / "net.py"
    script.write_text(SCRIPT)
    runner = CliRunner()
    monkeypatch.setenv("XLAPORT_MODELS_DIR", str(tmp_path / "empty"))
    monkeypatch.delenv("XLAPORT_MODEL", raising=False)
    result = runner.invoke(app, ["suggest", str(script)])
    assert result.exit_code == 0, result.output
    assert "running rules-only" in result.output and "model none (rules-only)" in result.output
    result = runner.invoke(app, ["suggest", str(script), "--model", str(tiny_model["dir"]), "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output[result.output.index("{") :])
    assert data["model"] == tiny_model["dir"].name
    assert data["evidence"]["rewritten_functions"] or any(n.startswith("Net.report: ") for n in data["notes"])
    result = runner.invoke(app, ["suggest", str(tmp_path / "missing.py")])
    assert result.exit_code == 2 and "error:" in result.output
