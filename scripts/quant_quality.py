"""What int8 and int4 weights cost in quality: the perplexity of a model trained by scripts/train_stdlib.py on the
standard library files it held out, in its own dtype, int8, and int4 in groups of 128 and 64.

  python3 scripts/quant_quality.py DIR --out DIR/quality.json [--windows 1000] [--seq 512] [--groups 128,64]

Each form is a fresh load of DIR (od.load_model: bfloat16 on CUDA, float32 on CPU) quantized with od.quantize;
all are scored on the same windows: the held-out files (read again from the stdlib named in train.json, checked
against its SHA-256) as one stream of <s> ids </s> documents, cut into non-overlapping windows of --seq tokens, of
which --windows are taken evenly spaced. Perplexity is exp(mean cross-entropy) over every next token of every
window; "top-1 agreement" is the share of positions whose most likely token is the unquantized model's. Weight
bytes are the parameters' bytes as the model holds them (packed codes, scales and zeros; the embedding table stays
in full precision). The JSON goes to --out (a new file: an earlier result is never overwritten) and a markdown
table to stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import time

from train_stdlib import _Parser, _positive, encode_documents, fail, read_source, texts_digest, window_starts


def _groups(text: str) -> list[int]:
    parts = text.split(",")
    if not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"expected positive group sizes separated by commas, got {text!r}")
    return [int(p) for p in parts]


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="quant_quality.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("model", metavar="DIR", help="a directory scripts/train_stdlib.py wrote")
    ap.add_argument("--out", required=True, help="the JSON file to write (a new path; required)")
    ap.add_argument("--windows", type=_positive, default=1000, help="windows scored at most (default: 1000)")
    ap.add_argument("--seq", type=_positive, help="tokens per window (default: the training window)")
    ap.add_argument("--batch", type=_positive, default=16, help="windows per forward (default: 16)")
    ap.add_argument("--groups", type=_groups, default=[128, 64], help="int4 group sizes (default: 128,64)")
    ap.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    return ap


def heldout_texts(record: dict) -> dict[str, str]:
    """The held-out files train.json names, as they were when it was trained (else a one-line refusal)."""
    split = record["split"]
    texts = {}
    for rel in split["heldout"]:
        text = read_source(split["stdlib"], rel)
        if text is None:
            fail(f"quant_quality.py: held-out file {rel} is not under {split['stdlib']} (trained on another Python?)")
        texts[rel] = text
    if texts_digest(texts) != split["heldout sha256"]:
        fail(f"quant_quality.py: the held-out files under {split['stdlib']} differ from those the model was trained on")
    return texts


def score(models: list, windows, batch: int) -> list[dict]:
    """Per model: summed next-token cross-entropy, summed KL divergence from the first model's next-token
    distribution, positions whose most likely token is the first model's, and the positions scored."""
    import torch
    import torch.nn.functional as F

    sums = [{"nll": 0.0, "kl": 0.0, "agree": 0, "count": 0} for _ in models]
    with torch.inference_mode():
        for chunk in windows.split(batch):
            target = chunk[:, 1:]
            base = None
            for model, acc in zip(models, sums):
                logp = F.log_softmax(model(input_ids=chunk).logits[:, :-1].float(), dim=-1)
                base = logp if base is None else base
                acc["nll"] -= logp.gather(-1, target[..., None]).sum().item()
                acc["kl"] += (base.exp() * (base - logp)).sum().item()
                acc["agree"] += (logp.argmax(-1) == base.argmax(-1)).sum().item()
                acc["count"] += target.numel()
    return sums


def markdown(rows: list[dict]) -> str:
    lines = [
        "| form | group | perplexity | ratio to unquantized | KL from unquantized | top-1 agreement | weight MB |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['form']} | {r['group']} | {r['perplexity']:.4f} | {r['ratio']:.4f} | "
            f"{r['kl from unquantized']:.5f} | {r['top-1 agreement']:.4f} | {r['weight bytes'] / 1e6:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    train_json = os.path.join(args.model, "train.json")
    if not os.path.isfile(train_json):
        fail(f"quant_quality.py: {args.model} has no train.json (give a directory scripts/train_stdlib.py wrote)")
    if os.path.exists(args.out):
        fail(f"quant_quality.py: --out {args.out} exists: choose a new path (no run overwrites an earlier one)")
    with open(train_json) as f:
        record = json.load(f)
    seq = args.seq or record["args"]["seq"]
    import torch

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        fail(f"quant_quality.py: --device {args.device}: no CUDA device here")
    texts = heldout_texts(record)
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    import overlapdecode as od
    from overlapdecode.facts import weight_bytes
    from overlapdecode.quant.modules import QUANTIZED

    hf_logging.disable_progress_bar()  # one bar per load and per form otherwise
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    stream = torch.tensor(encode_documents(tokenizer, list(texts.values())), dtype=torch.long)
    starts = window_starts(len(stream), seq, args.windows)
    if not starts:
        fail(f"quant_quality.py: the held-out text has {len(stream)} tokens, fewer than one window of --seq {seq}")
    windows = torch.stack([stream[s : s + seq] for s in starts]).to(device)
    dtype = "bfloat16" if device.type == "cuda" else "float32"
    forms = [(dtype, None, "-"), ("int8", "int8", "row")] + [("int4", "int4", g) for g in args.groups]

    models = []
    for _, scheme, group in forms:
        model = od.load_model(args.model, dtype=dtype, device=device)  # a fresh copy per form
        if scheme == "int4":
            od.quantize(model, "int4", group_size=group)
        elif scheme == "int8":
            od.quantize(model, "int8")
        models.append(model)
    t = time.perf_counter()
    sums = score(models, windows, args.batch)
    seconds = time.perf_counter() - t
    rows = []
    for (form, _, group), model, acc in zip(forms, models, sums):
        n = acc["count"]
        rows.append(
            {
                "form": form,
                "group": group,
                "perplexity": math.exp(acc["nll"] / n),
                "ratio": math.exp((acc["nll"] - sums[0]["nll"]) / n),
                "mean nll": acc["nll"] / n,
                "kl from unquantized": acc["kl"] / n,
                "top-1 agreement": acc["agree"] / n,
                "weight bytes": weight_bytes(model),
                "quantized layers": sum(isinstance(m, QUANTIZED) for m in model.modules()),
            }
        )

    result = {
        "command": shlex.join(["python3", "scripts/quant_quality.py", *argv]),
        "model": os.path.abspath(args.model),
        "trained": {
            k: record[k]
            for k in ("command", "parameters", "steps", "tokens seen", "final train loss", "final heldout loss")
        },
        "python": sys.version,
        "versions": {"torch": torch.__version__, "overlapdecode": od.__version__},
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": dtype,
        "seq": seq,
        "windows": len(starts),
        "heldout files": len(texts),
        "heldout tokens": len(stream),
        "tokens scored": windows[:, 1:].numel(),
        "seconds scoring": round(seconds, 2),
        "forms": rows,
    }
    table = markdown(rows)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "x") as f:
        json.dump({**result, "table": table}, f, indent=1)
    print(table)
    return result


if __name__ == "__main__":
    main()
