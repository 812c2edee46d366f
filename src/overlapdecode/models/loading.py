"""Load a causal LM: a Hugging Face hub name, a local directory, or an embedded random config.

The embedded configs exist so that the benchmark and the tests run with no download: `gpt2-random` is the
GPT-2 124M architecture with random weights (the benchmark's reference model), `tiny-gpt2` and
`tiny-llama` are small enough for CPU tests. The `llama-*-random` shapes are Llama-3's; `smollm2-*-random` and
`qwen2.5-*-random` are smaller Llama-family shapes with other head counts and GQA ratios (SmolLM2-360M and -1.7B,
Qwen2.5-0.5B and -1.5B, the Qwen2 ones with their QKV biases), to measure the fused step on. Other families
at real size, with their own vocabularies: `qwen3-0.6b-random` (Qwen3-0.6B: RMSNorm on each head's queries and
keys), `gemma3-1b-random` (Gemma-3-1B: five 512-token sliding-window layers to one global layer, each kind with
its own RoPE base) and `qwen3-moe-random` (a mixture of experts cut down from Qwen3-30B-A3B: its layer, 12 of its
48 layers and 32 of its 128 experts, 8 experts per token; 2.7B parameters). `phi3-mini-random` is
Phi-3.5-mini-instruct (3.8B: Q/K/V and gate/up each one matrix as shipped, LongRoPE to 128K positions).
`olmo2-1b-random` is OLMo-2-0425-1B (1.5B: RMSNorm after each branch and none before, Q/K norms over the whole
projection). `smollm3-3b-random` is SmolLM3-3B (3.1B: every fourth layer without RoPE). `granite-2b-random` is
granite-3.1-2b-instruct (2.5B: its embedding, attention, residual and logit multipliers). `gemma2-2b-random` is
gemma-2-2b (2.6B: 4096-token sliding-window and global layers alternating, attention and final logits soft-capped,
built with eager attention since Hugging Face's SDPA attention skips the cap). `mixtral-random` is Mixtral-8x7B's
layer in 8 of its 32 layers (8 experts, 2 per token; 11.9B parameters). `gpt-oss-random` is gpt-oss-20b's layer in
12 of its 24 layers (32 experts with biases, 4 per token, attention sinks, 128-token sliding and full layers
alternating, YaRN; 11.0B parameters, eager attention: its class has no SDPA one). Random weights give the same time
per token as trained ones; only the text is meaningless, which the command line says.
Their tokenizer is the byte-level one of tokenizer.py (random text out, but text in and out with no download).

Every argument is checked before anything is built or downloaded: a device that does not exist, a seed a
generator cannot take, or a path that does not exist is a ValueError/TypeError naming the argument; a
directory or hub model whose config is no decoder-only causal LM (a saved BertForMaskedLM, which
AutoModelForCausalLM would load as a BertLMHeadModel attending both ways) is refused from its config alone.
"""

from __future__ import annotations

import contextlib
import copy
import os
import socket
import urllib.parse

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from .. import tp as tensor_parallel
from ..inputs import check_causal_config
from ..quant import checkpoints as quant_checkpoints
from ..quant import model as quant_model
from ..sampling import check_seed
from . import prequantized, random_init
from .embedded import EMBEDDED, embedded_list
from .shapes import FAMILY_SHAPES, LLAMA_SHAPES, SMALL_SHAPES, TINY_SHAPES
from .tokenizer import ByteTokenizer


def causal_lm_class(model_type: str) -> type:
    """The Hugging Face causal-LM class of `model_type`, by the name transformers' own table gives it: its modeling
    module is imported when a model of that type is loaded, not by every process that imports this one."""
    return getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])


_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """`"bfloat16"` or `torch.bfloat16` -> `torch.bfloat16`; anything else is a ValueError naming `dtype`."""
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPES.values():
            raise ValueError(f"dtype must be one of float32, float16, bfloat16, got {dtype}")
        return dtype
    if isinstance(dtype, str) and dtype in _DTYPES:
        return _DTYPES[dtype]
    raise ValueError(f"dtype must be one of {sorted(set(_DTYPES))}, got {dtype!r}")


def embedded_config(name: str):
    """The config of an embedded model name; EOS is the last vocabulary id, as in GPT-2."""
    if name in LLAMA_SHAPES:
        hidden, layers, heads, kv_heads, inter, tied, theta, scaling = LLAMA_SHAPES[name]
        rope = dict(rope_type="default", rope_theta=theta) if scaling is None else dict(scaling, rope_theta=theta)
        return LlamaConfig(
            vocab_size=128256,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            intermediate_size=inter,
            tie_word_embeddings=tied,
            max_position_embeddings=131072 if scaling else 8192,
            rms_norm_eps=1e-5,
            rope_parameters=rope,
            bos_token_id=128000,
            eos_token_id=128001,
        )
    if name in SMALL_SHAPES:
        cls, hidden, layers, heads, kv_heads, inter, vocab, theta, eps, eos, positions = SMALL_SHAPES[name]
        return cls(
            vocab_size=vocab,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            intermediate_size=inter,
            tie_word_embeddings=True,
            max_position_embeddings=positions,
            rms_norm_eps=eps,
            rope_parameters=dict(rope_type="default", rope_theta=theta),
            bos_token_id=eos,
            eos_token_id=eos,
        )
    for table in (TINY_SHAPES, FAMILY_SHAPES):
        if name in table:
            cls, kwargs = table[name]
            return cls(**copy.deepcopy(kwargs))  # a config of its own: a caller may change it
    raise ValueError(f"unknown embedded model {name!r}; embedded models are {embedded_list()}")


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def check_device(device) -> torch.device:
    """`device` as a torch.device that exists on this machine (None: CUDA if available, else CPU)."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise TypeError(
            f"device must be a str such as 'cpu' or 'cuda:0', a torch.device or None, got {type(device).__name__}"
        )
    if isinstance(device, int):
        raise TypeError(f"device must be a str such as 'cpu' or 'cuda:{device}', not the int {device}")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise ValueError(f"device {device!r} is not a device: use 'cpu', 'cuda' or 'cuda:N'") from None
    if dev.type == "cpu":
        return dev
    if dev.type != "cuda":
        raise ValueError(f"device {device!r}: only 'cpu' and 'cuda' devices are supported")
    if not torch.cuda.is_available():
        raise ValueError(f"device={dev} was asked for but CUDA is not available on this machine")
    count = torch.cuda.device_count()
    if dev.index is not None and dev.index >= count:
        raise ValueError(f"device={dev}: this machine has {count} CUDA device(s), indices 0-{count - 1}")
    return dev


def looks_like_path(name: str) -> bool:
    """A model name meant as a local path rather than a hub name: it starts with /, . or ~, or has more than
    one '/' (a hub id is 'name' or 'org/name', so one '/' alone does not make a path), or a backslash
    separator on Windows."""
    if name.startswith(("/", ".", "~")) or name.count("/") > 1:
        return True
    return os.sep != "/" and os.sep in name


def check_model_path(name_or_path) -> None:
    """Refuse, naming it as a path, a name that is meant as a local path (has a separator, or starts with
    . or ~) but is not a directory; an embedded name or a would-be hub name passes."""
    if not isinstance(name_or_path, str) or not name_or_path:
        raise TypeError(f"name_or_path must be a non-empty string, got {name_or_path!r}")
    if name_or_path in EMBEDDED:
        return
    path = os.path.expanduser(name_or_path)
    if os.path.isdir(path):
        return
    if os.path.exists(path):
        raise ValueError(f"path {name_or_path} is a file, not a model directory (saved with save_pretrained)")
    if looks_like_path(name_or_path):
        raise ValueError(
            f"path {name_or_path} does not exist (give a model directory, a hub name or one of {embedded_list()})"
        )


def _hub_unreachable(timeout: float = 5.0) -> str | None:
    """Why the Hugging Face hub cannot be reached from here, or None (reachable, or behind a proxy, which only
    the hub client knows how to use)."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    if any(
        os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
    ):
        return None
    url = urllib.parse.urlsplit(constants.ENDPOINT)
    try:
        socket.create_connection(
            (url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout=timeout
        ).close()
    except OSError as err:
        return f"{url.hostname}: {err.strerror or err}"
    return None


def pretrained_config(name_or_path: str, what: str | None = None):
    """The config of a directory or hub name, checked to be a decoder-only causal LM (inputs.check_causal_config)
    before any weight is read; from_pretrained's own errors otherwise.

    A hub name is looked up in the local Hugging Face cache first; one that is not there while the hub cannot
    be reached is an OSError at once (the hub client retries for about 30 s before it says so). `what` starts
    the message of a config that is no causal LM (default: "name_or_path NAME")."""
    check_model_path(name_or_path)
    path = os.path.expanduser(name_or_path)
    if os.path.isdir(path):
        config = AutoConfig.from_pretrained(path)
    else:
        try:
            config = AutoConfig.from_pretrained(path, local_files_only=True)
        except OSError:
            why = _hub_unreachable()
            if why is not None:
                raise OSError(
                    f"{name_or_path} is neither a directory nor in the local Hugging Face cache, and the "
                    f"hub cannot be reached to look it up ({why})"
                ) from None
            config = AutoConfig.from_pretrained(path)
    check_causal_config(config, what or f"name_or_path {name_or_path}")
    return config


def _embedded_attention(cls, config, asked: str) -> str:
    """The attention implementation an embedded model is built with: `asked`, but eager in place of SDPA for a class
    that has no SDPA attention (gpt-oss) and for a config that soft-caps the attention logits (Gemma 2: Hugging Face's
    SDPA attention skips the cap, and later transformers versions refuse the pair)."""
    if asked == "sdpa" and (not cls._supports_sdpa or getattr(config, "attn_logit_softcapping", None) is not None):
        return "eager"
    return asked


def load_model(
    name_or_path: str,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device | None = None,
    seed: int = 0,
    attn_implementation: str = "sdpa",
    tp: int = 1,
    quantize: str | None = None,
    group_size: int = 128,
):
    """Return a causal LM in eval mode on `device` (default: CUDA if available, else CPU).

    `name_or_path` is an embedded name (see EMBEDDED; random weights drawn with `seed`), a local directory
    or a hub name (both through `from_pretrained`; hub names need network access). `attn_implementation` is Hugging
    Face's; an embedded gpt-oss (no SDPA attention) or Gemma 2 (attention soft-capping) takes eager in place of SDPA.

    `tp=N` > 1, in each process of `torchrun --nproc-per-node N`: this rank's tensor-parallel shard (tp.py),
    on cuda:LOCAL_RANK when `device` is CUDA without an index; torch.distributed is started if the caller
    has not. Every rank must load with the same arguments (a ValueError on every rank otherwise) and call
    `generate` with the same arguments. Hub models and directories are read whole on the host by every rank,
    then cut; the real-size llama-*-random shapes are drawn directly as shards (random_init.py), equal to
    their tp=1 weights on the same kind of device.

    `quantize` ("int4", "int8" or "fp8"; None: full precision): the decoder's linear layers and the LM head quantized as
    `od.quantize(model, quantize, group_size)` does (quant/), never two full-precision copies on the device: an
    embedded model is made on the device, then quantized matrix by matrix in place (the Llama shapes and the small
    ones: each matrix quantized as it is drawn, so that a 70B shape never exists whole); a directory or hub model
    is read on the host and each matrix quantized as it moves to the device. Not with tp > 1 nor for mixtures of
    experts.

    A directory holding an AWQ (GEMM) or GPTQ int4 checkpoint (its config's quantization_config) is read as one
    (prequantized.py): its quantized layers become Int4Linear layers of the same weights, without quantize=. A
    variant that is not read (bits other than 4, other kernels' layouts...) is a ValueError naming it, before any
    weight is read. A quantized model that save_pretrained wrote (its config.json names its scheme) loads back
    quantized, as it was saved.
    """
    check_model_path(name_or_path)
    torch_dtype = parse_dtype(dtype)
    device = check_device(device)
    check_seed(seed, allow_none=False)
    tp = tensor_parallel.check_tp(tp)
    if quantize is not None:
        quant_model.check_scheme(quantize, group_size, name="quantize")
        if tp > 1:
            raise ValueError("quantize: tensor-parallel shards are not quantized yet; load with tp=1")

    if name_or_path in EMBEDDED:
        config = embedded_config(name_or_path)
        if quantize is not None:
            quant_model.check_config(config, "quantize")
        cls = causal_lm_class(config.model_type)
        config._attn_implementation = _embedded_attention(cls, config, attn_implementation)
        place = tensor_parallel.prepare(tp, device, config)  # validates tp on every rank; starts the group
        tensor_parallel.check_same_on_every_rank(
            place, name_or_path=name_or_path, dtype=str(torch_dtype), seed=seed, attn_implementation=attn_implementation
        )
        device = place.device
        drawn = name_or_path in LLAMA_SHAPES or name_or_path in SMALL_SHAPES
        if drawn:  # drawn as shards, or quantized as drawn: a 70B never exists whole in full precision
            model = random_init.random_model(cls, config, place, torch_dtype, seed, quantize, group_size)
        else:
            # Made directly on the device in the asked dtype, then cut (small shapes; the other families' shapes,
            # which tensor parallelism has no plan for: prepare() refuses tp > 1 for them). The seed fixes the
            # weights for a given device (CPU and CUDA generators differ).
            fork = [device] if device.type == "cuda" else []
            with torch.random.fork_rng(devices=fork, device_type=device.type), _default_dtype(torch_dtype), device:
                torch.manual_seed(seed)
                model = cls(config)
            model = tensor_parallel.shard_(model.to(device=device, dtype=torch_dtype), place)
        model.generation_config.eos_token_id = config.eos_token_id
        model.generation_config.bos_token_id = config.bos_token_id
        if quantize is not None and not drawn:  # in place, on the device: each matrix's storage freed as it goes
            quant_model.quantize_layers(model, quant_model.linear_layers(model), quantize, group_size)
        return model.eval()

    path = os.path.expanduser(name_or_path)
    config = pretrained_config(name_or_path)
    saved = prequantized.saved_format(config, name_or_path)
    if saved is not None:  # a quantized model save_pretrained wrote
        _check_prequantized(name_or_path, f"overlapdecode {saved[0]}", config, quantize, tp)
        return prequantized.load_saved(path, config, *saved, torch_dtype, device, attn_implementation)
    fmt = quant_checkpoints.read_format(config, f"name_or_path {name_or_path}: its quantization_config")
    if fmt is not None:
        _check_prequantized(name_or_path, fmt, config, quantize, tp)
        return prequantized.load_checkpoint(path, config, fmt, torch_dtype, device, attn_implementation)
    if quantize is not None:
        quant_model.check_config(config, "quantize")
    place = tensor_parallel.prepare(tp, device, config if tp > 1 else None)
    tensor_parallel.check_same_on_every_rank(
        place, name_or_path=name_or_path, dtype=str(torch_dtype), attn_implementation=attn_implementation
    )
    model = AutoModelForCausalLM.from_pretrained(
        path, config=config, dtype=torch_dtype, attn_implementation=attn_implementation
    )
    if quantize is not None:  # read on the host; each matrix quantized as it moves to the device
        layers = quant_model.linear_layers(model)
        return quant_model.quantize_layers(model, layers, quantize, group_size, device=place.device).eval()
    return tensor_parallel.shard_(model, place).to(place.device).eval()


def _check_prequantized(name_or_path: str, fmt, config, quantize, tp: int) -> None:
    """What load_model refuses of a quantized checkpoint (`fmt`: AWQ, GPTQ or a saved quantized model), before
    anything is read: quantizing it again, tensor parallelism, a mixture of experts, a hub name (its files are read
    from a directory)."""
    if quantize is not None:
        raise ValueError(f"quantize: {name_or_path} is quantized already ({fmt}); load it without quantize")
    if tp > 1:
        raise ValueError(f"tp: {name_or_path} is an {fmt} checkpoint; tensor-parallel shards of it are not made yet")
    try:
        quant_model.check_config(config)
    except ValueError:
        raise ValueError(
            f"name_or_path {name_or_path}: an {fmt} mixture of experts; quantized experts are not read yet"
        ) from None
    if not os.path.isdir(os.path.expanduser(name_or_path)):
        raise ValueError(
            f"name_or_path {name_or_path}: an {fmt} checkpoint is read from a local directory; download it first "
            f"(huggingface-cli download {name_or_path} --local-dir DIR) and give DIR"
        )


# the files a saved tokenizer is made of (one at least): without any, a directory has no tokenizer
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
)


def load_tokenizer(name_or_path: str):
    """The tokenizer of a model, set for generation: the byte-level one (tokenizer.py) for an embedded name,
    else the one saved with the model (hub name or directory). A directory saved without one (or with one that
    does not load) is a ValueError naming the path.

    A Hugging Face tokenizer is returned with `padding_side="left"` (generate refuses right padding, which is
    what most tokenizers are saved with) and, when it has no pad token, EOS as its pad token (GPT-2's has
    none, so `tokenizer(texts, padding=True)` would fail); padded positions are masked, so their id does not
    change the tokens.
    """
    check_model_path(name_or_path)
    if name_or_path in EMBEDDED:
        cfg = embedded_config(name_or_path)
        return ByteTokenizer(cfg.vocab_size, eos_token_id=cfg.eos_token_id, bos_token_id=cfg.bos_token_id)
    from transformers import AutoTokenizer  # optional and slow to import: only for hub models and directories

    path = os.path.expanduser(name_or_path)
    none_here = (
        f"{name_or_path}: no tokenizer in this directory (save one beside the model with tokenizer.save_pretrained)"
    )
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as err:
        if not os.path.isdir(path):
            raise
        if not any(os.path.exists(os.path.join(path, n)) for n in _TOKENIZER_FILES):
            raise ValueError(none_here) from None
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"{name_or_path}: its tokenizer does not load ({type(err).__name__}: {first})") from None
    # transformers 5 builds an empty tokenizer (no vocabulary) for a directory saved without one
    if getattr(tokenizer, "vocab_size", 1) == 0:
        raise ValueError(none_here)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
