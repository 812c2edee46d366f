"""The oracle drafts of the bench's speculative rows (`--assistant oracle[:A][@MODEL]`): drafts that propose the
model's own greedy tokens, a share A of them right, so that the acceptance rate is set by construction on random
weights, where no real draft predicts anything. The one-layer draft costs almost nothing; a draft of a given shape
(MODEL) costs what that model's step costs, so a round pays a real draft's steps. Both are fitted the same way: the
LM head, by least squares, on the draft's final hidden states at each position of the rows' greedy output."""

from __future__ import annotations

import copy

import torch

from ..inputs import model_limits

ORACLE = "oracle"
# the oracle draft's width: twice the positions it maps, rounded up to a multiple of its heads' width (and at least
# one head), so that its keys are well apart (oracle_draft)
ORACLE_HEAD = 64


def oracle_spec(spec: str | None) -> tuple[float, str | None] | None:
    """An --assistant `spec` of `oracle[:A][@MODEL]` -> (A, MODEL or None): the acceptance it asks for (1.0 without
    `:A`, else 0 < A <= 1) and the shape of its draft (None: the one-layer draft; MODEL, a name or directory: a draft
    of that shape, oracle_draft `body`). None for any other draft or none. ValueError for an oracle spec with no
    such A or an empty MODEL."""
    if spec is None:
        return None
    head, at, shape = spec.partition("@")
    if head != ORACLE and not head.startswith(f"{ORACLE}:"):
        return None
    if at and not shape.strip():
        raise ValueError(f"--assistant {spec}: oracle@MODEL names the draft's shape, e.g. oracle:0.7@llama-1b-random")
    text = head[len(ORACLE) + 1 :] if ":" in head else "1"
    try:
        a = float(text)
    except ValueError:
        a = None
    if a is None or not 0 < a <= 1:
        raise ValueError(f"--assistant {spec}: oracle:A takes an acceptance rate 0 < A <= 1, e.g. oracle:0.7")
    return a, shape if at else None


def oracle_acceptance(spec: str | None) -> float | None:
    """The acceptance an --assistant `spec` of `oracle[:A][@MODEL]` asks for (oracle_spec); None for any other draft
    or none."""
    parsed = oracle_spec(spec)
    return None if parsed is None else parsed[0]


def oracle_draft(
    model,
    ids: torch.Tensor | None,
    out: torch.Tensor | None,
    acceptance: float,
    seed: int,
    keys: int = 0,
    body=None,
):
    """A draft model that proposes the model's own greedy tokens: a one-layer GPT-2 on the model's device and dtype,
    of its vocabulary. Its attention writes nothing (its output projection and bias are zero), so what reaches the
    LM head at a position is a fixed function of the token and the position alone: their random embeddings through
    a random MLP (so that keys sharing tokens or positions, a token repeated, rows at one position, stay apart)
    and the final LayerNorm. Each position p of the rows' prompts' last column and continuations (`ids` (B, P),
    `out` (B, P + n), the model's greedy output from them, unpadded) is a key, the token after it its answer; the
    LM head is the least-squares solution that scores each key's answer 8 and every other token about 0 (the width,
    about twice the keys, keeps them independent), so a row fed its own tokens drafts the model's next ones. A
    seeded share 1 - `acceptance` of the keys answers a wrong token instead: a draft is accepted with probability
    `acceptance`, one token after another, independently, as the model E[tokens per round] = (1 - a^(K+1)) /
    (1 - a) assumes. Its step reads a vocabulary x width head (width 256 at batch 1 and 128 tokens): the bench
    measures it (draft_ratio). `out` None: no keys, as wide as `keys` of them would make it (the verify row times
    it at the width of its configuration's rows).

    `body` (a causal LM of the model's vocabulary: `--assistant oracle[:A]@MODEL`): a draft of that model's shape
    instead, its LM head fitted the same way on its own final hidden states at the keys (fitted_head_draft)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    if body is not None:
        return fitted_head_draft(model, body, ids, out, acceptance, seed)

    emb = model.get_output_embeddings().weight
    V, device, dtype = emb.shape[0], emb.device, emb.dtype
    positions = model_limits(model)[1] or 4096
    P = ids.shape[1] if ids is not None else 0
    rows = None if out is None else out.cpu()
    span = 0 if rows is None else rows.shape[1] - P  # keys at positions P - 1 .. P + span - 2
    n_keys = 0 if rows is None else rows.shape[0] * span
    D = max(ORACLE_HEAD, -(-2 * (n_keys or keys) // ORACLE_HEAD) * ORACLE_HEAD)
    config = GPT2Config(
        vocab_size=V,
        n_positions=positions,
        n_embd=D,
        n_layer=1,
        n_head=D // ORACLE_HEAD,
        n_inner=D,
        tie_word_embeddings=False,
        bos_token_id=None,  # no ids of GPT-2's own vocabulary: the model's may be narrower
        eos_token_id=None,
    )
    gen = torch.Generator().manual_seed(seed)
    with torch.device("meta"):
        draft = GPT2LMHeadModel(config)
    draft = draft.to_empty(device="cpu").float().eval()
    with torch.no_grad():
        for name, p in draft.named_parameters():
            p.fill_(1.0 if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")) else 0.0)
        if n_keys:
            mlp = draft.transformer.h[0].mlp
            # LayerNorm's unit-variance rows in, about unit-variance features out
            mlp.c_fc.weight.copy_(torch.randn(D, D, generator=gen) / D**0.5)
            mlp.c_proj.weight.copy_(torch.randn(D, D, generator=gen) / D**0.5)
            used = torch.unique(rows[:, P - 1 :])
            draft.transformer.wte.weight[used] = torch.randn(len(used), D, generator=gen)
            draft.transformer.wpe.weight[P - 1 : P - 1 + span] = torch.randn(span, D, generator=gen)
            features = draft.transformer(
                input_ids=rows[:, P - 1 : P - 1 + span],
                use_cache=False,
                position_ids=torch.arange(P - 1, P - 1 + span).expand(rows.shape[0], span),
            )
            x = features.last_hidden_state.reshape(n_keys, D)  # after the final LayerNorm
            draft.lm_head.weight.copy_(_fitted_head(x, _answers(rows, P, acceptance, V, gen), V))
    return draft.to(device=device, dtype=dtype)


def _answers(rows: torch.Tensor, P: int, acceptance: float, V: int, gen: torch.Generator) -> torch.Tensor:
    """The answer of each key of the rows (B, P + span) (the token after positions P - 1 .. P + span - 2), a seeded
    share 1 - `acceptance` of them a wrong token instead -> (B * span,)."""
    answers = rows[:, P:].reshape(-1)
    wrong = torch.rand(answers.numel(), generator=gen) >= acceptance
    return torch.where(wrong, (answers + torch.randint(1, V, (answers.numel(),), generator=gen)) % V, answers)


def _fitted_head(x: torch.Tensor, answers: torch.Tensor, V: int) -> torch.Tensor:
    """(n, D) features of the keys, (n,) their answers -> the (V, D) float32 head that scores each key's answer 8 and
    every other token about 0: the least-squares solution of x @ head.T = 8 * one-hot (minimum norm; rows of
    tokens no key answers are 0)."""
    targets, column = torch.unique(answers, return_inverse=True)
    onehot = torch.zeros(len(answers), len(targets), dtype=torch.float64)
    onehot[torch.arange(len(answers)), column] = 8.0
    head = torch.zeros(V, x.shape[1])
    head[targets] = (torch.linalg.pinv(x.double()) @ onehot).T.float()
    return head


@torch.no_grad()
def fitted_head_draft(model, body, ids: torch.Tensor | None, out: torch.Tensor | None, acceptance: float, seed: int):
    """A draft of `body`'s shape that proposes the model's own greedy tokens, a share `acceptance` of them right: a
    new module of body's class whose decoder is body's own (shared, not copied) and whose LM head (untied) is fitted
    as oracle_draft's on the decoder's final hidden states at the keys, each over its row's tokens up to it. A
    row of the rounds drafts at a key only along the greedy tokens (a rejected draft's slot is written again
    before it is read), so it meets the hidden state the fit saw, but for rounding: the fit runs the decoder over
    whole rows, the draft one token a step. Hidden states alike at keys of other answers (a greedy output in a
    loop, with wrong answers) make some drafts miss: the row's measured acceptance says how many. `out` None: body's
    shape with its own head (the verify row times its step)."""
    V = model.get_output_embeddings().weight.shape[0]
    head = body.get_output_embeddings().weight
    if head.shape[0] != V:
        raise ValueError(f"--assistant oracle@MODEL: the draft scores {head.shape[0]} token ids, the model {V}")
    if out is None:
        return body
    device, dtype = head.device, head.dtype
    prefix = body.base_model_prefix
    decoder = getattr(body, prefix)
    config = copy.deepcopy(body.config)
    config.tie_word_embeddings = False
    config.get_text_config().tie_word_embeddings = False  # the same object, or a multimodal model's text config
    with torch.device("meta"):
        draft = type(body)(config)
    setattr(draft, prefix, decoder)
    draft.set_output_embeddings(torch.nn.Linear(head.shape[1], V, bias=False, device=device, dtype=dtype))
    left = [n for n, t in [*draft.named_parameters(), *draft.named_buffers()] if t.is_meta]
    if left:  # a class with weights outside its decoder and head: no draft of it to make (checked before the fit)
        raise ValueError(f"--assistant oracle@MODEL: {type(body).__name__} has weights beside its decoder: {left[:3]}")
    P = ids.shape[1]
    rows = out.to(device)
    states = decoder(input_ids=rows[:, :-1], attention_mask=torch.ones_like(rows[:, :-1]), use_cache=False)
    x = states.last_hidden_state[:, P - 1 :].reshape(-1, head.shape[1]).cpu()  # after the final norm
    answers = _answers(rows.cpu(), P, acceptance, V, torch.Generator().manual_seed(seed))
    draft.get_output_embeddings().weight.copy_(_fitted_head(x, answers, V).to(device=device, dtype=dtype))
    return draft.eval()
