"""Markdown tables of scripts/tp_probe.py's results (its JSON: `env` and `parts`), for the gathered benchmark
markdown: the token equality of tp=2 against tp=1, the speed of both, and the big model's figures."""

from __future__ import annotations

import json
import os

from .markdown import fmt, table


def tp_probe_summary(d: str) -> str | None:
    """Markdown tables of the scripts/tp_probe.py results (JSON with `env` and `parts`) in directory `d`,
    or None if it holds none: tokens of tp=2 against tp=1 (equal), ms/token of tp=1 and tp=2 (speed), and
    the big model's ms/token, weight bytes per GPU and MBU (big)."""
    files = []
    if not os.path.isdir(d):
        return None
    for name in sorted(os.listdir(d)):
        if name.endswith(".json"):
            with open(os.path.join(d, name)) as f:
                data = json.load(f)
            if isinstance(data, dict) and "parts" in data and "env" in data:
                files.append((name, data))
    if not files:
        return None
    out = [
        "Written by `scripts/tp_probe.py` (two GPUs of one host, torchrun); ms/token = the whole call / new "
        "tokens, decode = (call of N - call of 1) / (N - 1); MBU = bytes read per token per GPU / its time / "
        "the 4.8 TB/s spec, and against the device copy the probe measured."
    ]
    for name, data in files:
        env, parts = data["env"], data["parts"]
        out += [
            "",
            f"### `{name}`",
            "",
            f"Command: `{' '.join(env.get('argv', []))}`; commit {env.get('commit')}, "
            f"torch {env.get('torch')}, {env.get('gpu')}, NCCL {env.get('nccl')}.",
        ]
        if not parts:
            out += ["", "No part finished (the probe was stopped before writing a result)."]
        eq = parts.get("equal")
        if eq:
            rows = [[k, v.get("equal_tp1"), v.get("ranks_agree")] for k, v in eq.items() if isinstance(v, dict)]
            out += [
                "",
                f"equal: {eq.get('model')} {eq.get('dtype')}, {eq.get('new_tokens')} new tokens",
                "",
                table(["strategy", "tp=2 tokens = tp=1", "ranks agree"], rows),
            ]
        sp = parts.get("speed")
        if sp and "tp1" in sp and "tp2" in sp:
            rows = [
                [
                    k,
                    sp[k]["strategy"],
                    fmt(sp[k]["ms_per_token"], "{:.3f}"),
                    fmt(sp[k]["decode_ms_per_token"], "{:.3f}"),
                    fmt(sp[k]["weight_bytes_per_gpu"] / 1e9, "{:.2f}"),
                ]
                for k in ("tp1", "tp2")
            ]
            out += [
                "",
                f"speed: {sp.get('model')} {sp.get('dtype')}, batch {sp.get('batch')}; tp=2 / tp=1 = "
                f"{fmt(sp.get('ratio_ms_per_token'), '{:.2f}')} (decode {fmt(sp.get('ratio_decode_ms_per_token'), '{:.2f}')})",
                "",
                table(["tp", "strategy", "ms/token", "decode ms/token", "weights GB per GPU"], rows),
            ]
        big = parts.get("big")
        if big and "ms_per_token" in big:
            rows = [
                [
                    big["strategy"],
                    big["tp"],
                    big["new_tokens"],
                    fmt(big["ms_per_token"], "{:.2f}"),
                    fmt(big["weight_bytes_per_gpu"] / 1e9, "{:.1f}"),
                    fmt(100 * big["mbu_ms_per_token"], "{:.0f}%"),
                    fmt(100 * big["mbu_vs_copy_ms_per_token"], "{:.0f}%"),
                    fmt(big["first_call_s"], "{:.0f}"),
                ]
            ]
            out += [
                "",
                f"big: {big.get('model')} {big.get('dtype')}, batch {big.get('batch')}",
                "",
                table(
                    [
                        "strategy",
                        "tp",
                        "new tokens",
                        "ms/token",
                        "weights GB per GPU",
                        "MBU (spec)",
                        "MBU (copy)",
                        "first call s",
                    ],
                    rows,
                ),
            ]
    return "\n".join(out) + "\n"
