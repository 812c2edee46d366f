"""DIR/results.json: where a run's figures are kept, how they are read back, and what they were measured on.

A timed row of the fixed workload carries the kernels per step that the profile row of its own configuration
counted (with_kernel_counts): written so, and filled in on reading for files written before that.

A leaf of the bench: the runner writes results through it, the worker and the profiler record the
environment through it, and the report reads it. A results file is a user's measurements, so it is only
ever replaced whole (written beside, then renamed) and only by a run that measured something; a malformed
one is refused with one line naming the file and what is wrong.
"""

from __future__ import annotations

import glob
import json
import os
import platform
import subprocess

import torch
import transformers

from . import outdir

RESULTS = "results.json"

# Every row names its configuration; a timed row (one with `seq_s`) also carries its figures.
ROW_KEYS = ("strategy", "workload", "allocator", "dtype", "batch", "max_new_tokens")
TIMED_KEYS = ("seq_s", "seq_s_all", "ms_per_token", "tokens_per_s", "ttft_ms", "first_call_s", "new_tokens")
CONFIG_KEYS = ("model", "prompt_len", "repeats", "warmup")
# Figures a timed row may carry (None where not measured, e.g. memory on CPU): numbers when present.
OPTIONAL_FIGURES = (
    "peak_reserved_mb",
    "peak_allocated_mb",
    "fragmentation",
    "weight_bytes",
    "bandwidth_gbs",
    "device_mallocs",
    "layers",
    "decode_ms_per_step",
    "toll_us_per_layer",
    "kernels_per_step",
)
# What tells two rows' configurations apart (a later one of the same replaces the earlier: latest_rows); a
# speculative row's draft and K among them (absent, None, from rows written before them)
ROW_IDENTITY = (
    "model",
    "allocator",
    "dtype",
    "batch",
    "prompt_len",
    "workload",
    "max_new_tokens",
    "strategy",
    "speculation",
    "lookup_prompt",
    "assistant",
    "k",
)
# A speculative row's figures (bench/speculative.py), numbers where present (None: not measured); a verify row's
# lists, one value per token count of `verify_tokens`
SPECULATIVE_FIGURES = (
    "drafts_offered",
    "drafts_accepted",
    "acceptance_rate",
    "draft_acceptance",
    "rounds",
    "row_rounds",
    "tokens_per_round",
    "plain_ms_per_token",
    "speedup",
    "decode_speedup",
)
VERIFY_LISTS = ("verify_ms", "verify_ratio")
SPECULATION_KINDS = ("prompt_lookup", "assistant")
# What makes a profile row's kernel count that of a fixed row: the same configuration, so the same step.
SHAPE_KEYS = ("model", "tp", "allocator", "dtype", "batch", "prompt_len", "max_new_tokens", "strategy")
# What the report's "Machine:" line reads from an environment record.
ENV_KEYS = ("torch", "transformers", "python", "git_commit")


class ResultsError(ValueError):
    """A results file that cannot be read or used; the message names the file."""


def git_commit() -> str:
    """The commit of the checkout this package runs from (or of the working directory), else 'unknown'.

    OVERLAPDECODE_COMMIT overrides it, for copies of a checkout without .git (a remote GPU machine)."""
    if os.environ.get("OVERLAPDECODE_COMMIT"):
        return os.environ["OVERLAPDECODE_COMMIT"]
    here = os.path.dirname(os.path.abspath(__file__))
    for cwd in (here, os.getcwd()):
        try:
            out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            continue
        if out.returncode == 0:
            dirty = subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=cwd,
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
            return out.stdout.strip() + ("-dirty" if dirty else "")
    return "unknown"


def environment() -> dict:
    """What the figures were measured on: versions (transformers is the Hugging Face peers' version), machine,
    commit, and the GPU as this process sees it."""
    env = dict(
        torch=torch.__version__,
        transformers=transformers.__version__,
        python=platform.python_version(),
        platform=platform.platform(),
        cpu_count=os.cpu_count(),
        git_commit=git_commit(),
        cuda_available=torch.cuda.is_available(),
    )
    if torch.cuda.is_available():
        env.update(gpu=torch.cuda.get_device_name(0), cuda=torch.version.cuda)
    else:
        env.update(gpu=None, cuda=None)
    return env


def rows_files(out_dir: str) -> list[str]:
    """The JSON-lines files the workers of a run wrote into `out_dir` (rows.jsonl before the split per unit)."""
    return sorted(glob.glob(os.path.join(out_dir, "rows*.jsonl")))


def row_identity(r: dict) -> tuple:
    """A row's configuration (ROW_IDENTITY); a prompt lookup row written before `lookup_prompt` ran on the run's
    prompt ("random")."""
    if r.get("speculation") == "prompt_lookup" and r.get("lookup_prompt") is None:
        r = dict(r, lookup_prompt="random")
    return tuple(r.get(k) for k in ROW_IDENTITY)


def latest_rows(rows: list[dict]) -> list[dict]:
    """One row per configuration: a later row (from an --append run) replaces an earlier one of the same
    configuration, except that a row that could not be measured ("not run", out of memory) never replaces a
    measured one. Keeps the order of first appearance."""
    keep: dict = {}  # key -> (position of first appearance, row)
    for i, r in enumerate(rows):
        key = row_identity(r)
        if key in keep and "error" in r and "error" not in keep[key][1]:
            continue
        keep[key] = (keep[key][0] if key in keep else i, r)
    return [r for _, r in sorted(keep.values(), key=lambda p: p[0])]


def with_kernel_counts(rows: list[dict]) -> list[dict]:
    """`rows`, each timed row of the fixed workload that lacks `kernels_per_step` given the count of the profile
    row of its configuration (SHAPE_KEYS): GPU kernels per decode step, counted by the PyTorch profiler over one
    call of that same shape (timeline.analyze; CUDA only, and only where the call marks its decode steps: a
    Hugging Face peer's count stays unknown). A row without such a profile row keeps none. In place."""
    counts = {}
    for r in rows:
        busy = r.get("busy")
        if r.get("workload") == "profile" and isinstance(busy, dict) and _number(busy.get("kernels_per_step")):
            counts[tuple(r.get(k) for k in SHAPE_KEYS)] = busy["kernels_per_step"]
    for r in rows:
        key = tuple(r.get(k) for k in SHAPE_KEYS)
        if r.get("workload") == "fixed" and "seq_s" in r and r.get("kernels_per_step") is None and key in counts:
            r["kernels_per_step"] = counts[key]
    return rows


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _time(v) -> bool:
    """A measured time: a finite number > 0 (the report divides by it and plots it on log axes)."""
    return _number(v) and 0 < v < float("inf")


def _check(results, path: str) -> dict:
    """The structure the report relies on, or a ResultsError saying what is missing."""
    if not isinstance(results, dict):
        raise ResultsError(
            f"{path}: expected a JSON object with commands, config and rows, got "
            f"{type(results).__name__ if results is not None else 'null'}"
        )
    missing = [k for k in ("commands", "config", "rows") if k not in results]
    if missing:
        raise ResultsError(f"{path}: missing {', '.join(missing)} (not a results file of `overlapdecode bench`)")
    if not isinstance(results["rows"], list) or not all(isinstance(r, dict) for r in results["rows"]):
        raise ResultsError(f"{path}: rows must be a list of objects")
    if not isinstance(results["commands"], list):
        raise ResultsError(f"{path}: commands must be a list")
    if not isinstance(results["config"], dict) or any(k not in results["config"] for k in CONFIG_KEYS):
        raise ResultsError(f"{path}: config must be an object with {', '.join(CONFIG_KEYS)}")
    for i, r in enumerate(results["rows"]):
        need = ROW_KEYS + (TIMED_KEYS if "seq_s" in r else ())
        lacking = [k for k in need if k not in r]
        if lacking:
            raise ResultsError(f"{path}: row {i} lacks {', '.join(lacking)}")
        # the report sorts and groups rows by these and compares them with numbers and names
        wrong = [k for k in ("batch", "max_new_tokens") if not (isinstance(r[k], int) and not isinstance(r[k], bool))]
        wrong += [
            k for k in ("strategy", "workload", "allocator", "dtype", "device") if k in r and not isinstance(r[k], str)
        ]
        if wrong:
            raise ResultsError(
                f"{path}: row {i} has {', '.join(wrong)} of the wrong kind (integers for batch and "
                f"max_new_tokens, strings for names)"
            )
        if "seq_s" in r:  # the figures the report computes with
            wrong = [
                k for k in ("seq_s", "ms_per_token", "tokens_per_s", "ttft_ms", "first_call_s") if not _number(r[k])
            ]
            if not (isinstance(r["seq_s_all"], list) and r["seq_s_all"] and all(_time(t) for t in r["seq_s_all"])):
                wrong.append("seq_s_all")
            if "seq_s" not in wrong and not _time(r["seq_s"]):
                wrong.append("seq_s")
            wrong += [k for k in OPTIONAL_FIGURES if r.get(k) is not None and not _number(r[k])]
            if wrong:
                raise ResultsError(
                    f"{path}: row {i} has {', '.join(wrong)} of the wrong kind (numbers expected, times > 0)"
                )
        wrong = _speculative_faults(r)
        if wrong:
            raise ResultsError(f"{path}: row {i} has {', '.join(wrong)} of the wrong kind ({_SPECULATIVE_KINDS})")
    env = results.get("environment")
    if not isinstance(env, dict):  # older or hand-made files: say so in the report rather than refuse
        results["environment"] = dict(recorded=False, note=f"{RESULTS} has no environment record")
    elif env.get("recorded") is not False and any(k not in env for k in ENV_KEYS):
        results["environment"] = dict(
            recorded=False,
            note=f"{RESULTS}'s environment record lacks {', '.join(k for k in ENV_KEYS if k not in env)}",
        )
    return results


_SPECULATIVE_KINDS = (
    f"speculation one of {', '.join(SPECULATION_KINDS)}, an integer K >= 1, numbers for the figures, an "
    "acceptance rate in [0, 1], verify_tokens integers >= 1 with one time > 0 each"
)


def _speculative_faults(r: dict) -> list[str]:
    """The keys of a speculative or verify row that the report cannot use (none for other rows)."""
    wrong = []
    if r["workload"] == "speculative" and "error" not in r:
        if r.get("speculation") not in SPECULATION_KINDS:
            wrong.append("speculation")
        if not (_number(r.get("k")) and isinstance(r["k"], int) and r["k"] >= 1):
            wrong.append("k")
        wrong += [k for k in SPECULATIVE_FIGURES if r.get(k) is not None and not _number(r[k])]
        for name in ("acceptance_rate", "draft_acceptance"):
            a = r.get(name)
            if name not in wrong and a is not None and not 0 <= a <= 1:
                wrong.append(name)
    if r["workload"] == "verify" and "error" not in r:
        tokens = r.get("verify_tokens")
        if not (isinstance(tokens, list) and tokens and all(isinstance(t, int) and t >= 1 for t in tokens)):
            wrong.append("verify_tokens")
        else:
            for k in VERIFY_LISTS:
                v = r.get(k)
                if not (isinstance(v, list) and len(v) == len(tokens) and all(_time(x) for x in v)):
                    wrong.append(k)
        wrong += [
            k
            for k in ("draft_step_ms", "draft_ratio", "draft_feed_ms", "draft_feed_ratio")
            if r.get(k) is not None and not _time(r[k])
        ]
        if not isinstance(r.get("verify_graph", False), bool):
            wrong.append("verify_graph")
    return wrong


def load(out_dir: str) -> dict:
    """DIR/results.json, checked, its rows reduced to the latest per configuration (latest_rows)."""
    path = os.path.join(out_dir, RESULTS)
    if not os.path.exists(path):
        if rows_files(out_dir) and os.path.exists(os.path.join(out_dir, "config.json")):
            raise FileNotFoundError(
                f"{path} not found but {out_dir} holds the rows of an interrupted run: "
                f"`overlapdecode report {out_dir} --interrupted 'THE BENCH COMMAND'` keeps them"
            )
        raise FileNotFoundError(f"{path} not found: run `overlapdecode bench --out {out_dir}` first")
    try:
        with open(path) as f:
            results = json.load(f)
    except json.JSONDecodeError as err:
        raise ResultsError(f"{path}: not valid JSON ({err})") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ResultsError(f"{path}: cannot be read ({err})") from None
    results = _check(results, path)
    results["rows"] = with_kernel_counts(latest_rows(results["rows"]))
    return results


def write(out_dir: str, results: dict) -> None:
    """Replace DIR/results.json whole: written beside it, then renamed, so a crash never leaves it cut short
    (outdir.write_json: listed in the directory's manifest first)."""
    outdir.write_json(out_dir, RESULTS, results, "bench")


def finalize(
    out_dir: str, command: str, earlier: dict | None = None, interrupted: bool = False, reason: str | None = None
) -> dict:
    """Turn DIR/rows*.jsonl (one per worker; + config.json) into DIR/results.json. The environment is the one
    the workers recorded as they started (the GPU side); `interrupted` marks a run whose workers did not finish,
    and `reason` says why where it is known (`interrupted_reason`: Ctrl-C, a worker that failed).

    A run that measured nothing (no row without an error) leaves any earlier results.json untouched and
    raises ResultsError."""
    rows_paths = rows_files(out_dir)
    lines = []
    for path in rows_paths:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        lines.append(json.loads(line))
                    except json.JSONDecodeError as err:
                        if interrupted:  # a worker killed mid-write leaves a cut last line
                            continue
                        raise ResultsError(f"{path}:{n}: not valid JSON ({err})") from None
    metas = [r["meta"] for r in lines if "meta" in r]
    rows = [r for r in lines if "meta" not in r]
    if not any("error" not in r for r in rows):
        raise ResultsError(
            f"{out_dir}: the run measured nothing ({len(rows)} rows, none measured); "
            + (
                f"{RESULTS} left as it was"
                if os.path.exists(os.path.join(out_dir, RESULTS))
                else f"no {RESULTS} written"
            )
        )
    with open(os.path.join(out_dir, "config.json")) as f:
        cfg = json.load(f)
    env = (
        dict(metas[0])
        if metas
        else dict(
            recorded=False,
            note="the workers of this run predate the environment record; see the notes beside this directory",
        )
    )
    env.pop("allocator", None)
    env.pop("cuda_visible_devices", None)
    env.pop("cpus", None)
    shares = sorted({m["cpus"] for m in metas if m.get("cpus")})
    if shares:
        env["cpu_shares"] = shares  # the cores each GPU's worker was pinned to
    gpus = sorted({m["cuda_visible_devices"] for m in metas if m.get("cuda_visible_devices") is not None})
    if gpus:
        env["gpus_used"] = gpus  # one worker per GPU at a time (CUDA_VISIBLE_DEVICES of each worker)
    results = dict(commands=[command], environment=env, config=cfg, rows=rows, interrupted=interrupted)
    if interrupted and reason:
        results["interrupted_reason"] = reason
    if earlier is not None:
        results["commands"] = earlier["commands"] + [command]
        results["configs"] = earlier.get("configs", [earlier["config"]]) + [cfg]
        results["rows"] = latest_rows(earlier["rows"] + rows)  # a row measured now replaces a "not run" one
        results["interrupted"] = interrupted or earlier.get("interrupted", False)
        if not interrupted and earlier.get("interrupted_reason"):
            results["interrupted_reason"] = earlier["interrupted_reason"]
    with_kernel_counts(results["rows"])
    write(out_dir, results)
    for path in rows_paths:
        outdir.remove(out_dir, os.path.basename(path))
    return results
