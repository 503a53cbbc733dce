"""The code model: a Hugging Face causal LM + LoRA adapter that proposes rewrites the rules cannot make."""
