"""Migration traces → dataset → tokenizer → base model → LoRA fine-tuning, run through torch_xla."""
