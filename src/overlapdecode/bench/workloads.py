"""Benchmark inputs: seeded random prompts, and EOS forced per row at chosen steps.

With random weights EOS comes whenever it comes, so the `eos` workload forces it: a forward hook raises the
EOS logit of row r at the position whose next token is generated token s_r. It acts inside the model call
(all on the device, compile- and graph-friendly), so every strategy and every Hugging Face peer meets the
same stops, and early stopping and the late stop check are exercised at known steps.
"""

from __future__ import annotations

import torch

WORKLOADS = ("fixed", "eos")


def prompt(batch: int, prompt_len: int, vocab: int, device, seed: int = 0) -> torch.Tensor:
    """(B, P) random ids (no padding: every row has the same length, as the reference measured)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab - 1, (batch, prompt_len), generator=g).to(device)


def eos_steps(batch: int, max_new_tokens: int) -> list[int]:
    """Generated-token index at which each row emits EOS: spread from 1/4 to 3/4 of the run."""
    if batch == 1:
        return [max(0, max_new_tokens // 2)]
    return [round((max_new_tokens - 1) * (0.25 + 0.5 * r / (batch - 1))) for r in range(batch)]


class ForcedEOS:
    """Context manager: while active, row r of `model` emits `eos_id` as generated token `steps[r]`.

    Registering a hook changes what a compiled step must do, so register one instance once, for batches up to
    `capacity`, and move the stops with `set_steps`: in place, so a compiled graph keeps reading the same buffer.
    Dynamo does not guard on module hooks (torch._dynamo.config.skip_nnmodule_hook_guards): a step compiled
    before the hook was registered would run without it, and one compiled with it would go on running it after
    its removal. So registering and removing it drop the compiled code (dynamo's reset), and the next compiled
    call traces the model as it is then.
    """

    def __init__(self, model, eos_id: int, capacity: int, device):
        self.model = model
        self.eos_id = eos_id
        self.stop_pos = torch.full((capacity,), -1, dtype=torch.long, device=device)  # (capacity,)
        self.handle = None

    def set_steps(self, steps: list[int], prompt_lens: list[int]) -> None:
        """Row r stops at generated token steps[r]; prompt_lens[r] = its real (unpadded) prompt length."""
        # the logits at position p choose the token at p + 1: generated token s comes from position len - 1 + s
        pos = [s + n - 1 for s, n in zip(steps, prompt_lens)]
        self.stop_pos[: len(pos)].copy_(torch.tensor(pos, dtype=torch.long))

    def _hook(self, module, args, kwargs, output):
        pos = kwargs.get("position_ids")
        if pos is None:
            raise RuntimeError("ForcedEOS needs position_ids passed by keyword (generate and HF generate do)")
        hit = pos[:, -1] == self.stop_pos[: pos.shape[0]]  # (B,)
        logits = output.logits  # (B, T, V)
        logits[:, -1, self.eos_id] = torch.where(hit, 1e4, logits[:, -1, self.eos_id])
        return output

    def __enter__(self):
        self.handle = self.model.register_forward_hook(self._hook, with_kwargs=True)
        torch._dynamo.reset()
        return self

    def __exit__(self, *exc):
        self.handle.remove()
        torch._dynamo.reset()
        return False
