"""An update object kept apart from the training loop: calling it runs backward, clips and steps."""

import torch


class ClippedUpdate:
    def __init__(self, max_norm):
        self.max_norm = max_norm

    def __call__(self, loss, optimizer, params):
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, self.max_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
