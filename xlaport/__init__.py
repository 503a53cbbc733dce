"""xlaport: move CUDA-era PyTorch code to TPUs through PyTorch/XLA, and prove the move kept its behaviour.

Subpackages (top-level folders of the repository):
- `xlaport.kb`       the fix knowledge base: libcst rules, the lint/fix engine, retrieval
- `xlaport.eval`     validation: XLA execution check, generated differential tests, L0–L4 verify, benchmarks
- `xlaport.serve`    the migration pipeline and its fronts: bulk rewrite, HTTP service, MCP tool
- `xlaport.model`    the code model that proposes rewrites the rules cannot make
- `xlaport.training` traces → dataset → tokenizer → base model → LoRA fine-tuning through torch_xla
"""

__version__ = "0.1.0"
