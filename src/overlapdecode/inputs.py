"""Validation of `generate()` arguments, before any GPU work.

Bad input must end in a ValueError/TypeError naming the argument, never in a device-side assert (an id
outside the vocabulary reaches an embedding lookup), a hang, or silently wrong tokens (right padding,
positions past the model's table). The value checks read the prompt once on the host: one sync per call,
before the loop, never on the per-step path.

The model is checked first, from its class and config only (no forward): it must be a decoder-only causal
LM with an LM head (what `AutoModelForCausalLM` loads), its weights must be real (not on the meta device),
and it must be in eval mode. `AutoModelForCausalLM` also loads an encoder's directory (a saved
`BertForMaskedLM` comes back as `BertLMHeadModel`, attending both ways, as its config has is_decoder=False):
`check_causal_config` refuses those from the config alone, before any weight is read (load_model calls it
too). A model in training mode is refused rather than switched: its dropout would make two calls differ,
and changing the caller's module behind its back (also for other threads using it) is worse than asking
for `model.eval()`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Request:
    """Checked, normalised arguments of one `generate()` call."""

    input_ids: torch.Tensor  # (B, P) long, on the model's device
    attention_mask: torch.Tensor  # (B, P) long, 0 = left padding
    max_new_tokens: int
    eos_ids: tuple[int, ...]  # empty = never stop early
    pad_id: int


# Heads of a saved architecture that are no causal LM: a directory naming only these is refused.
_NOT_CAUSAL_HEADS = (
    "ForMaskedLM",
    "ForSequenceClassification",
    "ForTokenClassification",
    "ForQuestionAnswering",
    "ForMultipleChoice",
    "ForNextSentencePrediction",
    "ForPreTraining",
)


class NotCausalLM(ValueError):
    """A model (or a saved config) that is no decoder-only causal LM."""


def check_causal_config(config, what: str) -> None:
    """A NotCausalLM (ValueError), starting with `what` (the argument: "model X", "name_or_path X"), for a
    config that is no decoder-only causal LM: an encoder-decoder; saved architectures that are all masked-LM,
    classification or other encoder heads; an encoder family (one with a masked-LM class, such as BERT or
    RoBERTa) whose config does not say is_decoder=True, so that its causal-LM class would attend both ways."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    if getattr(config, "is_encoder_decoder", False):
        raise NotCausalLM(
            f"{what} is an encoder-decoder model ({config.model_type}); generate needs a decoder-only causal LM"
        )
    archs = list(getattr(config, "architectures", None) or [])
    if archs and all(a.endswith(_NOT_CAUSAL_HEADS) for a in archs):
        raise NotCausalLM(
            f"{what} was saved as {', '.join(archs)}, which is not a causal LM (masked-LM and "
            f"classification heads are refused); generate needs a decoder-only causal LM"
        )
    if config.model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not getattr(config, "is_decoder", False):
        raise NotCausalLM(
            f"{what} is an encoder ({config.model_type} with is_decoder=False: its causal-LM class "
            f"would attend both ways); generate needs a decoder-only causal LM"
        )


def check_model(model) -> None:
    """A decoder-only causal LM with an LM head, with real weights, in eval mode; else a ValueError/TypeError
    naming `model`. Cheap: class, config and one parameter's device."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"model must be a Hugging Face causal LM (e.g. from overlapdecode.load_model), got {type(model).__name__}"
        )
    name = type(model).__name__
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "get_text_config") or not hasattr(model, "get_output_embeddings"):
        raise TypeError(
            f"model must be a Hugging Face causal LM (e.g. from overlapdecode.load_model), got {name}, "
            f"which has no Hugging Face config"
        )
    if getattr(config, "is_encoder_decoder", False):
        raise ValueError(f"model {name} is an encoder-decoder model; generate needs a decoder-only causal LM")
    can_generate = getattr(model, "can_generate", None)
    if model.get_output_embeddings() is None or not (callable(can_generate) and can_generate()):
        raise ValueError(
            f"model {name} is not a causal LM with an LM head (load it with AutoModelForCausalLM "
            f"or overlapdecode.load_model)"
        )
    check_causal_config(config, f"model {name}")  # a generating class can still be an encoder (BertLMHeadModel)
    param = next(model.parameters(), None)
    if param is None:
        raise ValueError(f"model {name} has no parameters")
    if param.device.type == "meta":
        raise ValueError(
            f"model {name} is on the meta device (its weights were never loaded); load it with "
            f"overlapdecode.load_model or from_pretrained"
        )
    if model.training:
        raise ValueError(
            f"model {name} is in training mode (dropout on: two calls would differ); call model.eval() first"
        )


def model_limits(model) -> tuple[int, int | None]:
    """(vocabulary size, maximum number of positions or None)."""
    config = model.config.get_text_config(decoder=True)
    vocab = model.get_output_embeddings().weight.shape[0] if model.get_output_embeddings() is not None else None
    vocab = min(v for v in (vocab, getattr(config, "vocab_size", None)) if v is not None)
    max_pos = getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)
    return vocab, max_pos if isinstance(max_pos, int) and max_pos > 0 else None  # XLNet says -1: no table


def position_ids_for_prompt(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, P) positions as Hugging Face generate makes them: count of real tokens - 1, 0 on left padding."""
    pos = attention_mask.long().cumsum(-1) - 1
    return pos.masked_fill(attention_mask == 0, 0)


def model_device(model) -> torch.device:
    return next(model.parameters()).device


def _id_list(name: str, value) -> tuple[int, ...]:
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    if isinstance(value, bool) or not isinstance(value, (int, list, tuple)):
        raise TypeError(f"{name} must be an int or a list of ints, got {type(value).__name__}")
    ids = (value,) if isinstance(value, int) else tuple(value)
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int):
            raise TypeError(f"{name} must hold ints, got {i!r}")
    return ids


def default_eos(model) -> tuple[int, ...]:
    """The model's EOS ids: generation_config first, then config, as Hugging Face does."""
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None) if gen is not None else None
    if eos is None:
        eos = getattr(model.config.get_text_config(decoder=True), "eos_token_id", None)
    return () if eos is None else _id_list("eos_token_id", eos)


def default_pad(model) -> int | None:
    """The model's pad id, from its generation_config as Hugging Face generate() reads it (not from config:
    generate() does not look there), or None when it sets none."""
    gen = getattr(model, "generation_config", None)
    pad = getattr(gen, "pad_token_id", None) if gen is not None else None
    if pad is None:
        return None
    ids = _id_list("pad_token_id", pad)
    return ids[0] if ids else None


def check_request(model, input_ids, attention_mask, max_new_tokens, eos_token_id, pad_token_id) -> Request:
    """Validate the model, prompt, mask, length and special ids of a call; return them normalised."""
    check_model(model)
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids must be a torch.Tensor, got {type(input_ids).__name__}")
    if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
        raise TypeError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be 2-D (batch, prompt_len), got shape {tuple(input_ids.shape)}")
    B, P = input_ids.shape
    if B == 0 or P == 0:
        raise ValueError(f"input_ids is empty (shape {tuple(input_ids.shape)}): give at least one prompt token")
    device = model_device(model)
    if input_ids.device != device:
        raise ValueError(f"input_ids is on {input_ids.device} but the model is on {device}")

    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise TypeError(f"max_new_tokens must be an int, got {type(max_new_tokens).__name__}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    vocab, max_pos = model_limits(model)
    if max_pos is not None and P + max_new_tokens > max_pos:
        raise ValueError(
            f"prompt length {P} + max_new_tokens {max_new_tokens} = {P + max_new_tokens} exceeds the model's "
            f"{max_pos} positions"
        )

    if attention_mask is None:
        mask = torch.ones_like(input_ids, dtype=torch.long)
    else:
        if not isinstance(attention_mask, torch.Tensor):
            raise TypeError(f"attention_mask must be a torch.Tensor or None, got {type(attention_mask).__name__}")
        if attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"attention_mask shape {tuple(attention_mask.shape)} does not match input_ids {tuple(input_ids.shape)}"
            )
        if attention_mask.device != input_ids.device:
            raise ValueError(f"attention_mask is on {attention_mask.device} but input_ids is on {input_ids.device}")
        if attention_mask.dtype.is_complex:
            raise TypeError(f"attention_mask must hold 0 and 1, got dtype {attention_mask.dtype}")
        mask = attention_mask

    eos = default_eos(model) if eos_token_id is None else _id_list("eos_token_id", eos_token_id)
    if pad_token_id is not None and (isinstance(pad_token_id, bool) or not isinstance(pad_token_id, int)):
        raise TypeError(f"pad_token_id must be an int or None, got {type(pad_token_id).__name__}")
    pad = pad_token_id if pad_token_id is not None else default_pad(model)
    # Hugging Face infers a missing mask from a pad id it was given (by the call or the generation config) that is
    # no EOS id: 0 where the prompt holds the pad id, if it holds it anywhere (_prepare_attention_mask_for_generation;
    # only for int32/int64 ids)
    infer = attention_mask is None and pad is not None and pad not in eos
    infer = infer and input_ids.dtype in (torch.int32, torch.int64)
    if pad is None:
        pad = eos[0] if eos else 0  # Hugging Face: the first EOS id
    # Nor can it where the pad id is an EOS id (load_tokenizer sets that up for a tokenizer without a pad token):
    # a batch without a mask is then attended whole, padding included, and Hugging Face warns of it
    # (_prepare_special_tokens); so does this call, where the prompt holds that id (read below)
    unmaskable = attention_mask is None and B > 1 and pad in eos
    for name, ids in (("eos_token_id", eos), ("pad_token_id", (pad,))):
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise ValueError(f"{name} {bad} outside the vocabulary [0, {vocab})")

    # One host read of the prompt and mask: host sync, once per call, before the loop. Without a mask (and no
    # pad id to infer one from) only the ids' range is read (two launches instead of a dozen: the time to the
    # first token is mostly host time).
    lo_hi = torch.aminmax(input_ids)
    inferred = False
    if attention_mask is None and not infer:
        reads = [lo_hi.min.long(), lo_hi.max.long()] + ([(input_ids == pad).any().long()] if unmaskable else [])
        lo, hi, *holds_pad = torch.stack(reads).tolist()
        unmaskable = bool(holds_pad and holds_pad[0])
        bad_mask = bad_pad = False
    else:
        checked = (input_ids != pad).long() if infer else mask
        not_binary = ((checked != 0) & (checked != 1)).any()
        right_pad = (checked[:, -1] == 0).any() | (checked.long().diff(dim=1) < 0).any()
        any_pad = (checked == 0).any()
        lo, hi, bad_mask, bad_pad, any_pad = torch.stack(
            [lo_hi.min.long(), lo_hi.max.long(), not_binary.long(), right_pad.long(), any_pad.long()]
        ).tolist()
        if infer:
            inferred = bool(any_pad)
            mask = checked if inferred else mask
    if lo < 0 or hi >= vocab:
        raise ValueError(f"input_ids holds ids in [{lo}, {hi}], outside the vocabulary [0, {vocab})")
    if bad_mask:
        raise ValueError("attention_mask must hold only 0 and 1")
    if bad_pad and inferred:
        raise ValueError(
            f"input_ids holds the pad id {pad} other than as left padding, and without an attention_mask the mask "
            f"is inferred from the pad id (0 where it is), as Hugging Face generate() does; pass attention_mask"
        )
    if bad_pad and attention_mask is not None:
        raise ValueError(
            "attention_mask has right padding (a 0 after a 1, or a row ending in 0); decoder-only "
            "generation needs left padding (tokenizer.padding_side = 'left')"
        )
    if unmaskable:
        warnings.warn(
            f"attention_mask is not set and input_ids holds the pad id {pad}, which is also an EOS id, so no mask "
            f"can be inferred from it: every position is attended, padding included, as Hugging Face generate() "
            f"does (it warns of this too); pass the tokenizer's attention_mask to leave the padding out",
            UserWarning,
            stacklevel=4,  # check_request <- make_plan <- Decoder.generate <- its caller
        )
    return Request(input_ids.long(), mask.long(), max_new_tokens, eos, pad)
