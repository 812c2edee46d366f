"""The collectives of a tensor-parallel decode step: the traced all-reduce, the vocabulary-parallel logits
gather, the one-shot symmetric-memory all-reduce of the fused step, and the residual add around a
row-parallel projection.

The all-reduce is a functional collective (`torch.ops._c10d_functional`): dynamo traces it into the compiled
step, so the compiled presets keep one graph per step and, on CUDA, it is recorded in the step's CUDA graph;
eagerly it runs on gloo (CPU) as on NCCL.

The fused step's kernels fuse the residual add into the epilogue of `w_o` and `w_down`: `reduce_residual`
keeps that, adding the residual (and bias) on rank 0 only (the other ranks add zeros) before the one
all-reduce, so the sum holds them once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def all_reduce_sum(x: torch.Tensor, group: str) -> torch.Tensor:
    """Sum over the tensor-parallel group. A functional collective: traced by dynamo into the compiled step
    (and its CUDA graph); eagerly it blocks the stream, not the host, until the sum is ready."""
    return torch.ops._c10d_functional.wait_tensor(torch.ops._c10d_functional.all_reduce(x, "sum", group))


@dataclass(frozen=True)
class VocabShard:
    """A vocabulary-parallel LM head (the fused step's, fused/layout.py): this rank holds rows [lo, hi) of the
    (vocab, hidden) LM head, `chunk` = ceil(vocab / tp) rows per rank (the last may hold fewer, even none), and
    `gather_logits` puts every rank's logits back together. Why: the replicated head is read whole by every
    rank at every step (1.05 GB of Llama-3-8B's 9.08 GB per GPU at tp=2); sharded, each reads 1/tp of it, for
    one all-gather of B x vocab/tp float32 logits."""

    group: str
    rank: int
    tp: int
    vocab: int

    @property
    def chunk(self) -> int:
        return -(-self.vocab // self.tp)

    @property
    def rows(self) -> tuple[int, int]:
        lo = min(self.rank * self.chunk, self.vocab)
        return lo, min(lo + self.chunk, self.vocab)

    def gather_logits(self, local: torch.Tensor) -> torch.Tensor:
        """(B, hi - lo) logits of this rank's rows -> (B, vocab), the same on every rank. A functional
        all-gather, as all_reduce_sum (inside a compiled step and its CUDA graph); a rank holding fewer than
        `chunk` rows pads with -inf, which the trim drops."""
        B, n = local.shape
        if n < self.chunk:
            local = torch.nn.functional.pad(local, (0, self.chunk - n), value=float("-inf"))
        full = torch.ops._c10d_functional.wait_tensor(
            torch.ops._c10d_functional.all_gather_into_tensor(local.contiguous(), self.tp, self.group)
        )
        return full.view(self.tp, B, self.chunk).transpose(0, 1).reshape(B, self.tp * self.chunk)[:, : self.vocab]


@dataclass(frozen=True)
class RowReduce:
    """How a row-parallel projection's partial sums are combined: the group, and this process's rank in it."""

    group: str
    rank: int


class SymmetricAllReduce:
    """One-shot all-reduce over symmetric memory, for the fused decode step on CUDA (its StepGraph captures it).

    Why: a decode step's all-reduces are tiny (B x hidden: 8 KB at Llama-3-8B, batch 1) and there are two per
    layer; NCCL's fixed cost per call, even inside a CUDA graph, ate most of what tp=2 saves
    (docs/TENSOR_PARALLEL.md). Here each rank's kernel writes its partial sum straight
    into its own buffer of a pair that every rank mapped at rendezvous, and one kernel
    (`torch.ops.symm_mem.one_shot_all_reduce`) waits at a barrier for the peers, reads their buffers over
    NVLink and sums: no NCCL launch, no ring. The two buffers of a shape alternate: a rank can be at most one
    all-reduce ahead of another (each one starts with a barrier), so the buffer it writes next is never one
    a peer is still reading. Buffers are made (a collective rendezvous) on first use of a shape, during the
    step's first, eager run, which every rank runs in the same order.
    """

    def __init__(self, group: str, device: torch.device):
        import torch.distributed._symmetric_memory as symm_mem  # CUDA builds only

        self._symm_mem = symm_mem
        self.group = group
        self.device = device
        self._pairs: dict = {}
        self._turn: dict = {}
        if not symm_mem.is_symm_mem_enabled_for_group(group):
            symm_mem.enable_symm_mem_for_group(group)

    def buffer(self, shape, dtype) -> torch.Tensor:
        """The next buffer of this shape for a partial sum (the caller writes it, then calls `sum`)."""
        key = (tuple(shape), dtype)
        pair = self._pairs.get(key)
        if pair is None:
            pair = [self._symm_mem.empty(*shape, dtype=dtype, device=self.device) for _ in range(2)]
            for t in pair:
                self._symm_mem.rendezvous(t, self.group)  # collective: every rank, in the same order
            self._pairs[key] = pair
            self._turn[key] = 0
        turn = self._turn[key]
        self._turn[key] = 1 - turn
        return pair[turn]

    def sum(self, buf: torch.Tensor) -> torch.Tensor:
        """The sum over the group of every rank's `buf` (a new tensor; ordered on the current stream)."""
        return torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", self.group)


def reduce_residual(
    linear_residual, x, w, b, residual, reduce: RowReduce | None, symmetric: SymmetricAllReduce | None = None
):
    """`linear_residual(x, w, b, residual)` = residual + x @ w.T + b, for a w holding 1/tp of its input features
    (None: unsharded, called as is). Residual and bias join on rank 0 only, then one all-reduce sums the
    partial products: a kernel that fuses the residual add into its epilogue keeps doing so. With `symmetric`
    (the fused step on CUDA) the kernel writes its partial sum into a symmetric buffer (`out=`) and the
    one-shot all-reduce sums it; otherwise the functional collective does."""
    if reduce is None:
        return linear_residual(x, w, b, residual)
    if reduce.rank != 0:
        residual, b = torch.zeros_like(residual), None
    if symmetric is None:
        return all_reduce_sum(linear_residual(x, w, b, residual), reduce.group)
    buf = symmetric.buffer(residual.shape, residual.dtype)
    return symmetric.sum(linear_residual(x, w, b, residual, out=buf))
