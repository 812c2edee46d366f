"""Train a small Llama on the running Python's standard library sources: a model whose weights mean something, so
that the perplexity of its quantized forms (scripts/quant_quality.py) measures quantization error, and, trained
twice on one tokenizer, a target and a draft for speculative decoding.

  python3 scripts/train_stdlib.py --out DIR                                 (target: ~34M parameters, ~3 min, H200)
  python3 scripts/train_stdlib.py --out DRAFT --tokenizer DIR --hidden 256 --layers 4 --heads 4 --kv-heads 2 \
      --intermediate 768                                                    (a draft sharing DIR's tokenizer)

The corpus is every .py file under sysconfig's stdlib path (site-packages left out), split by file path: a file
is held out when the SHA-256 of its relative path falls in the lowest --heldout-percent (5) of the range, so the
split is the same on every machine with the same files, whatever the model. The tokenizer is a byte-level BPE
(`tokenizers`) trained on the training files (or DIR's, with --tokenizer), saved as a transformers fast tokenizer
whose encoding starts with <s>; each file is one document, <s> ids </s>, the documents one stream. Training draws
random windows of --seq + 1 tokens from the stream (a seeded generator), AdamW, linear warmup then cosine to a tenth
of --lr, bfloat16 autocast on CUDA. --max-seconds bounds the loop: the cosine then follows the larger of the step
and time fractions, so the schedule ends within the time whatever the GPU's speed. On CPU a seed gives the same run.

DIR (new, or empty) receives the model (save_pretrained, in the training dtype), the tokenizer and train.json: the
command, versions, the split (counts and held-out files), the loss curve, final loss, tokens seen, wall times.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shlex
import sys
import sysconfig
import time

BOS, EOS = "<s>", "</s>"
SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}


def fail(message: str):
    """A user's mistake: one line on stderr, exit status 2, before any training."""
    print(message, file=sys.stderr)
    raise SystemExit(2)


# ----------------------------------------------------------------------------------------------------------------
# the corpus (quant_quality.py reads the held-out files through these too)


def stdlib_root() -> str:
    return sysconfig.get_paths()["stdlib"]


def source_paths(root: str) -> list[str]:
    """Every .py file under `root`, relative, sorted; installed packages and caches left out."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        found += [os.path.relpath(os.path.join(folder, f), root) for f in files if f.endswith(".py")]
    return sorted(p.replace(os.sep, "/") for p in found)


def path_key(rel: str) -> int:
    """Where a file's relative path hashes to, in [0, 10000): the split and the --max-mb subset follow it."""
    return int(hashlib.sha256(rel.encode()).hexdigest()[:12], 16) % 10000


def read_source(root: str, rel: str) -> str | None:
    """The file's text, or None where it is not UTF-8 (a few test files on purpose)."""
    try:
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            return f.read()
    except (UnicodeDecodeError, OSError):
        return None


def split_sources(root: str, heldout_percent: float, max_mb: float | None) -> dict:
    """{"train": {path: text}, "heldout": {path: text}, "skipped": [paths]}; with `max_mb`, each side keeps its
    share of that many megabytes, files taken in path_key order (one at least)."""
    texts, skipped = {}, []
    for rel in source_paths(root):
        text = read_source(root, rel)
        if text is None:
            skipped.append(rel)
        else:
            texts[rel] = text
    cut = heldout_percent * 100
    sides = {"train": [r for r in texts if path_key(r) >= cut], "heldout": [r for r in texts if path_key(r) < cut]}
    if max_mb is not None:
        share = {"train": 1 - heldout_percent / 100, "heldout": heldout_percent / 100}
        for side, rels in sides.items():
            budget, kept = max_mb * 1e6 * share[side], []
            for rel in sorted(rels, key=lambda r: (path_key(r), r)):
                if kept and budget <= 0:
                    break
                kept.append(rel)
                budget -= len(texts[rel].encode())
            sides[side] = sorted(kept)
    return {**{side: {r: texts[r] for r in rels} for side, rels in sides.items()}, "skipped": skipped}


def texts_digest(texts: dict[str, str]) -> str:
    digest = hashlib.sha256()
    for rel, text in texts.items():
        digest.update(rel.encode() + b"\0" + text.encode() + b"\0")
    return digest.hexdigest()


def encode_documents(tokenizer, texts: list[str]) -> list[int]:
    """The documents as one stream: <s> ids </s> per text."""
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    return [t for doc in ids for t in (bos, *doc, eos)]


def window_starts(tokens: int, seq: int, windows: int) -> list[int]:
    """The first token of each of `windows` windows of `seq` tokens, evenly spaced over the stream's whole
    non-overlapping windows (all of them where there are fewer)."""
    whole = tokens // seq
    n = min(windows, whole)
    return [(i * whole // n) * seq for i in range(n)]


# ----------------------------------------------------------------------------------------------------------------
# the tokenizer


def train_tokenizer(texts: list[str], vocab: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, tok.token_to_id(BOS))])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS)


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.bos_token_id is None or tokenizer.eos_token_id is None:
        fail(f"train_stdlib.py: --tokenizer {path}: the tokenizer has no BOS or EOS token")
    return tokenizer


# ----------------------------------------------------------------------------------------------------------------
# training


def lr_factor(step: int, warmup: int, progress: float) -> float:
    """Linear warmup over `warmup` steps, times a cosine from 1 to 0.1 over `progress` (0 to 1)."""
    return min(1.0, (step + 1) / warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * min(progress, 1.0))))


def mean_loss(model, windows, batch: int, autocast) -> float:
    """The mean next-token cross-entropy over `windows` (rows of token ids)."""
    import torch
    import torch.nn.functional as F

    total, count = 0.0, 0
    with torch.inference_mode(), autocast:
        for chunk in windows.split(batch):
            logits = model(input_ids=chunk).logits[:, :-1].float()
            total += F.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum").item()
            count += chunk[:, 1:].numel()
    return total / count


def train(model, stream, heldout, args, device, log):
    """Train in place; returns (loss curve, steps, seconds, what stopped it). Each point of the curve has the
    training loss averaged since the point before, and the loss on `heldout` (windows of held-out text)."""
    import torch
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(args.seed)
    span = torch.arange(args.seq + 1, device=device)
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
        **({"fused": True} if device.type == "cuda" else {}),
    )
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.dtype == "bfloat16")
    curve, total, since, step = [], torch.zeros((), device=device), 0, 0
    start = last = time.perf_counter()
    stopped = "steps"
    model.train()
    while step < args.steps:
        elapsed = time.perf_counter() - start
        if args.max_seconds is not None and elapsed >= args.max_seconds:
            stopped = "max-seconds"
            break
        progress = max(step / args.steps, elapsed / args.max_seconds if args.max_seconds else 0.0)
        lr = args.lr * lr_factor(step, args.warmup, progress)
        for group in opt.param_groups:
            group["lr"] = lr
        starts = torch.randint(0, len(stream) - args.seq - 1, (args.batch,), generator=gen).to(device)
        window = stream[starts[:, None] + span]
        with autocast:
            logits = model(input_ids=window[:, :-1]).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), window[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        total += loss.detach()
        since += 1
        if step == 1 or step % args.log_every == 0 or step == args.steps:
            now = time.perf_counter()
            mean = total.item() / since  # the one host read per log line
            rate = since * args.batch * args.seq / (now - last)
            held = mean_loss(model, heldout, args.batch, autocast)
            model.train()
            curve.append(
                {
                    "step": step,
                    "loss": round(mean, 5),
                    "heldout loss": round(held, 5),
                    "lr": lr,
                    "seconds": round(now - start, 2),
                    "tokens/s": round(rate),
                }
            )
            log(
                f"step {step:6d}  loss {mean:.4f}  held-out {held:.4f}  lr {lr:.2e}  {rate / 1e3:8.1f}k tokens/s  "
                f"{now - start:7.1f} s"
            )
            total.zero_()
            since = 0
            last = time.perf_counter()  # the held-out loss's time left out of the rate
    seconds = time.perf_counter() - start
    model.eval()
    if since:  # the steps after the last point (a --max-seconds stop)
        held = mean_loss(model, heldout, args.batch, autocast)
        curve.append(
            {
                "step": step,
                "loss": round(total.item() / since, 5),
                "heldout loss": round(held, 5),
                "lr": lr,
                "seconds": round(seconds, 2),
            }
        )
    return curve, step, seconds, stopped


# ----------------------------------------------------------------------------------------------------------------
# the command


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage block
        fail(f"{self.prog}: {message} (see --help)")


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="train_stdlib.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the directory to write (new or empty; required)")
    ap.add_argument("--tokenizer", help="reuse the tokenizer saved in this directory (default: train one)")
    ap.add_argument("--vocab", type=_positive, default=8192, help="the trained tokenizer's size (default: 8192)")
    ap.add_argument("--hidden", type=_positive, default=512, help="hidden size (default: 512)")
    ap.add_argument("--layers", type=_positive, default=8, help="decoder layers (default: 8)")
    ap.add_argument("--heads", type=_positive, default=8, help="attention heads (default: 8)")
    ap.add_argument("--kv-heads", type=_positive, default=4, help="key/value heads (default: 4)")
    ap.add_argument("--intermediate", type=_positive, default=1536, help="MLP intermediate size (default: 1536)")
    ap.add_argument("--seq", type=_positive, default=512, help="training window in tokens (default: 512)")
    ap.add_argument("--batch", type=_positive, default=32, help="windows per step (default: 32)")
    ap.add_argument("--steps", type=_positive, default=6000, help="optimizer steps at most (default: 6000)")
    ap.add_argument("--max-seconds", type=_positive_float, help="stop the loop after this long (default: none)")
    ap.add_argument("--warmup", type=_positive, default=200, help="linear warmup steps (default: 200)")
    ap.add_argument("--lr", type=_positive_float, default=1e-3, help="peak learning rate (default: 1e-3)")
    ap.add_argument("--seed", type=int, default=0, help="weights and windows (default: 0)")
    ap.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    ap.add_argument(
        "--dtype",
        choices=("bfloat16", "float32"),
        help="bfloat16: autocast over float32 weights; float32: none (default: bfloat16 on CUDA, else float32)",
    )
    ap.add_argument("--log-every", type=_positive, default=100, help="steps per loss-curve point (default: 100)")
    ap.add_argument(
        "--eval-windows", type=_positive, default=32, help="held-out windows scored per curve point (default: 32)"
    )
    ap.add_argument("--heldout-percent", type=_positive_float, default=5.0, help="files held out (default: 5)")
    ap.add_argument("--max-mb", type=_positive_float, help="megabytes of source text at most (default: all)")
    ap.add_argument(
        "--tokenizer-mb", type=_positive_float, default=8.0, help="training text the tokenizer sees (default: 8)"
    )
    return ap


def check_args(args):
    """Everything a user can get wrong, in one line each, before any file is read or written."""
    if args.hidden % args.heads:
        fail(f"train_stdlib.py: --hidden {args.hidden} is not a multiple of --heads {args.heads}")
    if args.heads % args.kv_heads:
        fail(f"train_stdlib.py: --heads {args.heads} is not a multiple of --kv-heads {args.kv_heads}")
    if not args.heldout_percent < 50:
        fail(f"train_stdlib.py: --heldout-percent must be below 50, got {args.heldout_percent}")
    if os.path.exists(args.out) and (not os.path.isdir(args.out) or os.listdir(args.out)):
        fail(f"train_stdlib.py: --out {args.out} exists and is not an empty directory: choose a new one")
    if args.tokenizer is not None and not os.path.isfile(os.path.join(args.tokenizer, "tokenizer.json")):
        fail(
            f"train_stdlib.py: --tokenizer {args.tokenizer}: no tokenizer.json there (give a directory this script wrote)"
        )
    import torch

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        fail(f"train_stdlib.py: --device {args.device}: no CUDA device here")
    args.dtype = args.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    return device


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    device = check_args(args)
    import tokenizers
    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # save_pretrained's

    def log(line):
        print(line, flush=True)

    t0 = time.perf_counter()
    root = stdlib_root()
    split = split_sources(root, args.heldout_percent, args.max_mb)
    train_texts = list(split["train"].values())
    if not split["train"] or not split["heldout"]:
        fail(f"train_stdlib.py: no training or no held-out file under {root}")
    if args.tokenizer is not None:
        tokenizer, tokenizer_bytes = load_tokenizer(args.tokenizer), None
    else:
        keep, tokenizer_bytes = [], 0
        for rel in sorted(split["train"], key=lambda r: (path_key(r), r)):
            if keep and tokenizer_bytes >= args.tokenizer_mb * 1e6:
                break
            keep.append(split["train"][rel])
            tokenizer_bytes += len(keep[-1].encode())
        tokenizer = train_tokenizer(keep, args.vocab)
    stream = torch.tensor(encode_documents(tokenizer, train_texts), dtype=torch.long, device=device)
    if len(stream) <= args.seq + 1:
        fail(f"train_stdlib.py: {len(stream)} training tokens: fewer than --seq {args.seq} + 2")
    held_stream = torch.tensor(encode_documents(tokenizer, list(split["heldout"].values())), dtype=torch.long)
    starts = window_starts(len(held_stream), args.seq, args.eval_windows)
    if not starts:
        fail(f"train_stdlib.py: {len(held_stream)} held-out tokens: fewer than one window of --seq {args.seq}")
    heldout = torch.stack([held_stream[s : s + args.seq] for s in starts]).to(device)
    prepared = time.perf_counter() - t0
    log(f"corpus {root}: {len(split['train'])} training files ({len(stream)} tokens), {len(split['heldout'])} held out")
    log(f"prepared in {prepared:.1f} s")

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        intermediate_size=args.intermediate,
        max_position_embeddings=max(2048, args.seq),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(config).to(device)
    params = sum(p.numel() for p in model.parameters())
    log(f"model: {params / 1e6:.1f}M parameters on {device} ({args.dtype})")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    curve, steps, seconds, stopped = train(model, stream, heldout, args, device, log)
    tokens = steps * args.batch * args.seq
    log(f"trained {steps} steps, {tokens} tokens in {seconds:.1f} s: {tokens / seconds / 1e3:.1f}k tokens/s")

    os.makedirs(args.out, exist_ok=True)
    model.to(torch.bfloat16 if args.dtype == "bfloat16" else torch.float32).save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    record = {
        "command": shlex.join(["python3", "scripts/train_stdlib.py", *argv]),
        "args": vars(args),
        "python": sys.version,
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
        },
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "split": {
            "stdlib": root,
            "heldout percent": args.heldout_percent,
            "max mb": args.max_mb,
            "train files": len(split["train"]),
            "heldout files": len(split["heldout"]),
            "skipped (not UTF-8)": split["skipped"],
            "train bytes": sum(len(t.encode()) for t in train_texts),
            "heldout bytes": sum(len(t.encode()) for t in split["heldout"].values()),
            "heldout sha256": texts_digest(split["heldout"]),
            "heldout": list(split["heldout"]),
        },
        "tokenizer": {
            "from": args.tokenizer or "trained here",
            "vocab": len(tokenizer),
            "trained on bytes": tokenizer_bytes,
        },
        "parameters": params,
        "train tokens in stream": len(stream),
        "loss curve": curve,
        "final train loss": curve[-1]["loss"],
        "final heldout loss": curve[-1]["heldout loss"],
        "steps": steps,
        "stopped by": stopped,
        "tokens seen": tokens,
        "tokens/s": round(tokens / seconds),
        "seconds": {
            "prepare": round(prepared, 2),
            "train": round(seconds, 2),
            "total": round(time.perf_counter() - t0, 2),
        },
    }
    with open(os.path.join(args.out, "train.json"), "w") as f:
        json.dump(record, f, indent=1)
    log(f"wrote {args.out} in {record['seconds']['total']:.1f} s")
    return record


if __name__ == "__main__":
    main()
