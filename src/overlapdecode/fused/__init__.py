"""The `fused` decode path: the project's own one-token step (Triton kernels on CUDA, their torch twins
elsewhere) on weights re-laid out once, for the Llama family, GPT-2 and the decoders of layout.DECODERS. See
docs/KERNELS.md."""

from .cache import FusedCache, FusedKV
from .layout import SUPPORTED, fuse_weights, model_family
from .model import FusedModel

__all__ = ["SUPPORTED", "FusedCache", "FusedKV", "FusedModel", "fuse_weights", "model_family"]
