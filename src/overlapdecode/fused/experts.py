"""A mixture-of-experts block's weights as the fused step's LayerWeights fields (kernels/moe.py reads them): the
experts' stacked tensors at their own strides (no copy), the router, top k and renormalisation; gpt-oss's biases and
clamped activation. What kernels/moe.py does not run is a ValueError naming it."""

from __future__ import annotations

import torch

from .weights import refuse

MOE = ("qwen3_moe", "mixtral", "gpt_oss")  # the mixtures of experts the step runs (kernels/moe.py)


def _gpt_oss_experts(mlp, cfg) -> dict:
    """gpt-oss's MoE block as LayerWeights fields: its (E, H, 2I) gate_up_proj (gate and up columns interleaved)
    and (E, I, H) down_proj as (E, 2I, H) and (E, H, I) transposed views (the kernels read them at their strides:
    no copy, and the model's own parameters left as they are);
    the router's and experts' biases; the clamped activation's alpha and limit from the experts module."""
    experts, router = mlp.experts, mlp.router
    gate_up, down = experts.gate_up_proj, experts.down_proj
    E, H, I2 = gate_up.shape
    if tuple(down.shape) != (E, I2 // 2, H) or tuple(router.weight.shape) != (E, H):
        refuse(
            cfg, f"experts of shapes {tuple(gate_up.shape)}, {tuple(down.shape)}, router {tuple(router.weight.shape)}"
        )
    biases = [getattr(experts, n, None) for n in ("gate_up_proj_bias", "down_proj_bias")] + [router.bias]
    if any(b is None for b in biases):
        refuse(cfg, "experts or router without biases")
    return dict(
        w_up=gate_up.detach().transpose(1, 2),
        w_down=down.detach().transpose(1, 2),
        b_up=experts.gate_up_proj_bias.detach().contiguous(),
        b_down=experts.down_proj_bias.detach().contiguous(),
        router=router.weight.detach(),
        router_b=router.bias.detach(),
        top_k=int(router.top_k),
        topk_first=True,
        interleaved=True,
        swiglu=(float(experts.alpha), float(experts.limit)),
    )


def experts_fields(mlp, cfg) -> dict:
    """A sparse MoE block's LayerWeights fields: its experts' fused tensors (as shipped, at their strides: no copy),
    router, top k and renormalisation; a ValueError for what kernels/moe.py does not run (shared experts, biases,
    other layouts)."""
    if cfg.model_type not in MOE:
        refuse(cfg, "mixture-of-experts MLP")
    if cfg.model_type == "gpt_oss":
        return _gpt_oss_experts(mlp, cfg)
    experts, router = mlp.experts, mlp.gate
    for name in ("shared_expert", "shared_experts"):
        if getattr(mlp, name, None) is not None:
            refuse(cfg, "shared experts")
    gate_up, down = getattr(experts, "gate_up_proj", None), getattr(experts, "down_proj", None)
    if not (isinstance(gate_up, torch.Tensor) and isinstance(down, torch.Tensor) and gate_up.dim() == 3):
        refuse(cfg, f"experts stored as {type(experts).__name__} without (E, 2I, H) gate_up_proj tensors")
    if getattr(experts, "has_bias", False) or getattr(router, "bias", None) is not None:
        refuse(cfg, "expert or router biases")
    E, I2, H = gate_up.shape
    if tuple(down.shape) != (E, H, I2 // 2) or tuple(router.weight.shape) != (E, H):
        refuse(
            cfg, f"experts of shapes {tuple(gate_up.shape)}, {tuple(down.shape)}, router {tuple(router.weight.shape)}"
        )
    return dict(
        w_up=gate_up.detach(),
        w_down=down.detach(),
        router=router.weight.detach(),
        top_k=int(router.top_k),
        renorm=bool(getattr(router, "norm_topk_prob", True)),  # Mixtral's router always renormalises
    )
