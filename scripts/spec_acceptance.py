"""The acceptance rates speculative decoding gets where weights mean something, and the speed-up they give at
measured shapes: a target and a smaller draft trained by scripts/train_stdlib.py on one tokenizer, generating
greedily from prompts cut from the standard library files they held out.

  python3 scripts/spec_acceptance.py TARGET --draft DRAFT --out F.json [--prompts 64] [--prompt-len 128] \
      [--new-tokens 64] [--k 1,2,4,8] [--batch 8] [--strategy kv] [--shape NAME=TARGET_JSON[,DRAFT_JSON] ...]

For each K, every prompt runs three ways with od.generate: without speculation, with prompt lookup
(prompt_lookup_num_tokens=K) and with the draft (assistant_model=DRAFT, num_assistant_tokens=K); the speculative
tokens must equal the plain ones (a mismatch fails the run), and each call's rounds (the Decoder's
last_speculation) give the drafts offered and accepted and the tokens per round of a row. The prompts are
non-overlapping windows of the held-out stream (<s> ids </s> per file, as quant_quality.py reads it), evenly
spaced; EOS stops a row as generate() does.

A --shape names the one-token step and verify-step costs an `overlapdecode bench` run measured (its results.json,
a verify row of the strategy --cost-strategy, default fused) for a target shape and, after a comma, for a draft
shape. The projected speed-up at that shape is tokens per round / (the verify step's cost at K + 1 + (K + 1) x the
draft's one-token step), in the target's one-token steps: the bench's model of a round, with this script's
measured tokens per round in place of the formula's (1 - a^(K+1)) / (1 - a) (both are written). Prompt lookup's
draft costs nothing in the model; the draft model's rows need a draft shape.

The JSON goes to --out (a new file: an earlier result is never overwritten) and a markdown table to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time

from quant_quality import heldout_texts
from train_stdlib import _Parser, _positive, encode_documents, fail, window_starts


def _ks(text: str) -> list[int]:
    parts = text.split(",")
    if not all(p.isdigit() and 1 <= int(p) <= 8 for p in parts):
        raise argparse.ArgumentTypeError(f"expected drafts per round from 1 to 8 separated by commas, got {text!r}")
    return [int(p) for p in parts]


def _shape(text: str) -> tuple[str, str, str | None]:
    name, sep, paths = text.partition("=")
    files = paths.split(",")
    if not sep or not name or not files[0] or len(files) > 2:
        raise argparse.ArgumentTypeError(f"expected NAME=TARGET_JSON[,DRAFT_JSON], got {text!r}")
    return name, files[0], files[1] if len(files) == 2 else None


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="spec_acceptance.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("model", metavar="TARGET", help="a directory scripts/train_stdlib.py wrote: the target")
    ap.add_argument("--draft", required=True, help="the draft's directory, trained on TARGET's tokenizer (required)")
    ap.add_argument("--out", required=True, help="the JSON file to write (a new path; required)")
    ap.add_argument("--prompts", type=_positive, default=64, help="prompts (default: 64)")
    ap.add_argument("--prompt-len", type=_positive, default=128, help="tokens per prompt (default: 128)")
    ap.add_argument("--new-tokens", type=_positive, default=64, help="tokens generated per prompt (default: 64)")
    ap.add_argument("--k", type=_ks, default=[1, 2, 4, 8], help="drafts per round, 1-8 (default: 1,2,4,8)")
    ap.add_argument("--batch", type=_positive, default=8, help="prompts per call (default: 8)")
    ap.add_argument("--strategy", default="kv", help="the preset that generates (default: kv)")
    ap.add_argument(
        "--shape",
        type=_shape,
        action="append",
        default=[],
        metavar="NAME=TARGET_JSON[,DRAFT_JSON]",
        help="a shape's measured costs: bench results.json of the target shape and of a draft shape (repeatable)",
    )
    ap.add_argument("--cost-strategy", default="fused", help="the --shape runs' strategy (default: fused)")
    ap.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    return ap


def shape_costs(name: str, target_json: str, draft_json: str | None, strategy: str) -> dict:
    """{name, verify_ratio: {K+1: ratio}, draft_ratio (None without a draft shape), one-token ms of each}."""

    def verify_row(path: str) -> dict:
        if not os.path.isfile(path):
            fail(f"spec_acceptance.py: --shape {name}: {path} is not a file")
        try:
            with open(path) as f:
                rows = json.load(f)["rows"]
        except (ValueError, KeyError, TypeError):
            fail(f"spec_acceptance.py: --shape {name}: {path} is not a bench results.json (no rows)")
        found = [r for r in rows if r.get("workload") == "verify" and r.get("strategy") == strategy]
        if not found or "verify_ms" not in found[-1]:
            fail(f"spec_acceptance.py: --shape {name}: {path} has no measured verify row of strategy {strategy}")
        return found[-1]

    target = verify_row(target_json)
    draft = verify_row(draft_json) if draft_json else None
    return {
        "name": name,
        "target model": target["model"],
        "device": target.get("env", {}).get("gpu") or target.get("device"),
        "target one-token ms": target["verify_ms"][0],
        "verify_ratio": dict(zip(target["verify_tokens"], target["verify_ratio"])),
        "draft model": draft["model"] if draft else None,
        "draft one-token ms": draft["verify_ms"][0] if draft else None,
        "draft_ratio": draft["verify_ms"][0] / target["verify_ms"][0] if draft else None,
    }


def round_counts(stats) -> dict:
    """Drafts offered and accepted, and the rounds of a row still generating (spec/state.py SpecStats)."""
    return {
        "offered": sum(map(sum, stats.drafted)),
        "accepted": sum(map(sum, stats.accepted)),
        "row rounds": sum(sum(map(bool, a)) for a in stats.active),
    }


def projections(row: dict, shapes: list[dict]) -> dict:
    """Per shape: the speed-up the measured tokens per round give, and the formula's at the acceptance rate (the
    bench report's model of a round, bench/report/speculation.py)."""
    from overlapdecode.bench.report.speculation import model_speedup, round_cost

    out = {}
    k, drafts_cost = row["k"], row["drafts by"] == "draft model"
    for s in shapes:
        ratio = s["verify_ratio"].get(k + 1)
        if ratio is None or (drafts_cost and s["draft_ratio"] is None):
            continue
        draft = s["draft_ratio"] if drafts_cost else 0.0
        formula = model_speedup(row["acceptance"], k, ratio, draft) if row["acceptance"] is not None else None
        out[s["name"]] = {
            "speed-up": row["tokens per round"] / round_cost(k, ratio, draft),
            "formula speed-up": formula,
        }
    return out


def markdown(rows: list[dict], shapes: list[dict]) -> str:
    names = [s["name"] for s in shapes]
    head = ["drafts by", "K", "offered", "accepted", "acceptance", "tokens/round", *[f"{n} speed-up" for n in names]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["drafts by"], str(r["k"]), str(r["offered"]), str(r["accepted"])]
        cells += ["-" if r["acceptance"] is None else f"{r['acceptance']:.3f}", f"{r['tokens per round']:.2f}"]
        for n in names:
            p = r["projections"].get(n)
            cells.append("-" if p is None else f"{p['speed-up']:.2f}x")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    records = {}
    for flag, path in (("TARGET", args.model), ("--draft", args.draft)):
        train_json = os.path.join(path, "train.json")
        if not os.path.isfile(train_json):
            fail(
                f"spec_acceptance.py: {flag} {path} has no train.json (give a directory scripts/train_stdlib.py wrote)"
            )
        with open(train_json) as f:
            records[flag] = json.load(f)
    if os.path.exists(args.out):
        fail(f"spec_acceptance.py: --out {args.out} exists: choose a new path (no run overwrites an earlier one)")
    shapes = [shape_costs(*s, args.cost_strategy) for s in args.shape]
    import torch
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    import overlapdecode as od
    from overlapdecode.decode import decoder_for

    hf_logging.disable_progress_bar()
    od.resolve_strategy(args.strategy)  # an unknown preset: its one-line error before any work
    texts = heldout_texts(records["TARGET"])
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if AutoTokenizer.from_pretrained(args.draft).get_vocab() != tokenizer.get_vocab():
        fail(f"spec_acceptance.py: --draft {args.draft} has another vocabulary than {args.model}")
    stream = torch.tensor(encode_documents(tokenizer, list(texts.values())), dtype=torch.long)
    starts = window_starts(len(stream), args.prompt_len, args.prompts)
    prompts = torch.stack([stream[s : s + args.prompt_len] for s in starts]).to(args.device)
    target = od.load_model(args.model, dtype="float32", device=args.device)
    draft = od.load_model(args.draft, dtype="float32", device=args.device)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    pad = eos if pad is None else pad

    def run(ids, **spec):
        out = od.generate(
            target,
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=args.new_tokens,
            strategy=args.strategy,
            eos_token_id=eos,
            pad_token_id=pad,
            **spec,
        )
        return out, (round_counts(decoder_for(target).last_speculation) if spec else None)

    t0 = time.perf_counter()
    batches = prompts.split(args.batch)
    plain = [run(ids)[0] for ids in batches]
    rows = []
    for k in args.k:
        for kind, spec in (
            ("prompt lookup", dict(prompt_lookup_num_tokens=k)),
            ("draft model", dict(assistant_model=draft, num_assistant_tokens=k)),
        ):
            total = {"offered": 0, "accepted": 0, "row rounds": 0}
            for ids, want in zip(batches, plain):
                out, counts = run(ids, **spec)
                if not torch.equal(out, want):
                    fail(f"spec_acceptance.py: {kind} K={k} gave other tokens than {args.strategy} without it")
                total = {key: total[key] + counts[key] for key in total}
            row = {
                "drafts by": kind,
                "k": k,
                **total,
                "acceptance": total["accepted"] / total["offered"] if total["offered"] else None,
                "tokens per round": (total["accepted"] + total["row rounds"]) / total["row rounds"],
            }
            row["projections"] = projections(row, shapes)
            rows.append(row)
    seconds = time.perf_counter() - t0

    result = {
        "command": shlex.join(["python3", "scripts/spec_acceptance.py", *argv]),
        "target": {"path": os.path.abspath(args.model), **_trained(records["TARGET"])},
        "draft": {"path": os.path.abspath(args.draft), **_trained(records["--draft"])},
        "python": sys.version,
        "versions": {"torch": torch.__version__, "overlapdecode": od.__version__},
        "device": str(args.device),
        "strategy": args.strategy,
        "prompts": len(starts),
        "prompt len": args.prompt_len,
        "new tokens": args.new_tokens,
        "heldout files": len(texts),
        "seconds": round(seconds, 1),
        "shapes": shapes,
        "rows": rows,
    }
    table = markdown(rows, shapes)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "x") as f:
        json.dump({**result, "table": table}, f, indent=1)
    print(table)
    return result


def _trained(record: dict) -> dict:
    keep = ("command", "parameters", "steps", "tokens seen", "final heldout loss")
    return {k: record[k] for k in keep if k in record}


if __name__ == "__main__":
    main()
