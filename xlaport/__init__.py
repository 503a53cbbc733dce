"""xlaport: move CUDA-era PyTorch code to TPUs through PyTorch/XLA, and prove the move kept its behaviour.

Core (this folder; imports nothing else of xlaport): `cliutil`, `files`, `paths`, `trace`; `cli` mounts
each area's commands. Subpackages (top-level folders of the repository):
- `xlaport.kb`       the fix knowledge base: libcst rules, the lint/fix engine, retrieval
- `xlaport.eval`     evidence: XLA execution check, generated differential tests, L0–L4 verify
- `xlaport.model`    the code model: prompt format, function spans, the Proposer contract, the proposer
- `xlaport.serve`    the migration pipeline (one orchestrator) and its fronts: CLI, HTTP service, MCP tool
- `xlaport.training` traces → dataset → tokenizer → base model → LoRA fine-tuning through torch_xla (a leaf)
"""

__version__ = "0.1.0"
