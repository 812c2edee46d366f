"""One rank of a tensor-parallel test run, started by tests/tp/test_tp.py under
`python3 -m torch.distributed.run --nproc-per-node 2 tests/support/tp_worker.py SPEC.json OUT_DIR`.

SPEC holds the loads that must fail (`errors_before`: before torch.distributed is started, so the checks
read the environment; `errors_after`: once it is), then `jobs`: a model, a tp and generate() calls (with a job's
`fused_options`, through an od.Decoder made with them: the Triton kernels, in Triton's interpreter when the
environment has TRITON_INTERPRET=1). Each
rank writes what it saw to OUT_DIR/rank{R}.json: the error messages and every call's tokens. With
`"raise": true` the first expected error is re-raised once every rank's record is written, to show that every rank
exits. With
`"hang": true` each rank writes its pid to OUT_DIR/pid{R} and rank 0 waits in a barrier rank 1 never joins (the
test of the launcher's timeout). With `"crash": "once"` rank 1 dies of SIGSEGV unless OUT_DIR's parent holds
the file `crashed` (which it writes first): the test of the rerun after a crash.

Exit: a barrier, so that no rank tears the group down while another still needs it, then
destroy_process_group() (gloo: prompt; on NCCL it has hung at exit, so scripts/tp_probe.py skips it).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from transformers import DynamicCache, StaticCache

import overlapdecode as od

# names the test uses beyond the presets: the fused step without compile (no compile on CPU)
EXTRA = {"fused-eager": od.Strategy(cache="fused", compile=False, stop_check="sync")}


def _load(job: dict):
    """`per_rank`: load_model arguments that differ by rank ({name: [rank 0's, rank 1's]}), which must fail."""
    kw = dict(dtype="float32", seed=0)
    kw.update({k: v[int(os.environ["RANK"])] for k, v in job.get("per_rank", {}).items()})
    return od.load_model(job["model"], device="cpu", tp=job["tp"], **kw)


def _expect_errors(loads: list[dict], record: list[str], reraise: bool) -> None:
    for job in loads:
        try:
            _load(job)
        except (ValueError, TypeError) as err:
            record.append(str(err))
            if reraise:
                raise
        else:
            record.append("no error")


def _run_job(job: dict, results: dict) -> None:
    model = _load(job)
    options = job.get("fused_options")
    decoder = od.Decoder(model, fused_options=options) if options else od.decoder_for(model)
    for case in job["cases"]:
        ids = torch.tensor(case["ids"])
        mask = torch.tensor(case["mask"])
        for strategy in case["strategies"]:
            kw = dict(
                attention_mask=mask,
                max_new_tokens=case["max_new_tokens"],
                strategy=EXTRA.get(strategy, strategy),
                eos_token_id=case["eos"],
                pad_token_id=case["pad"],
                **case.get("sampling", {}),
            )
            out = decoder.generate(ids, **kw)
            results[f"{job['name']}/{case['name']}/{strategy}"] = out.tolist()
            if case is job["cases"][0] and strategy in job.get("stream_rank0", ()):
                # a streamer on rank 0 alone (the one that prints): host copies only, no collective, so the
                # ranks still issue the same collectives and return the same tokens
                streamed = []
                out = decoder.generate(
                    ids, **kw, streamer=(lambda t: streamed.append(t.tolist())) if os.environ["RANK"] == "0" else None
                )
                results[f"{job['name']}/stream-rank0/{strategy}"] = [out.tolist(), streamed]
            if "fused" in strategy:  # the fused step's LM head rows on this rank (tp.VocabShard), and the vocabulary
                fm = decoder.fused_model()
                W = fm.weights
                results[f"{job['name']}/lm-head-rows"] = [W.lm_head.shape[0], W.vocab.vocab if W.vocab else None]
                results[f"{job['name']}/fused-kernels"] = [fm.kernels, fm.writes_step_log]
    if job.get("seedless_sampling"):  # refused on every rank before any step: each rank's global generator differs
        try:
            decoder.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=2, strategy="kv", do_sample=True)
        except ValueError as err:
            results[f"{job['name']}/seedless-sampling"] = str(err)
    # the KV heads that Hugging Face's caches allocate on this rank
    for kind, cache in (
        ("static", StaticCache(config=model.config, max_cache_len=16)),
        ("dynamic", DynamicCache(config=model.config)),
    ):
        model(input_ids=torch.tensor([[3, 4, 5]]), past_key_values=cache, use_cache=True)
        results[f"{job['name']}/{kind}-cache-heads"] = [layer.keys.shape[1] for layer in cache.layers]


def _await_records(out_dir: str, limit_s: float = 60.0) -> None:
    """Wait until every rank has written its record before this one raises: the first rank to exit makes torchrun
    end the others, which could be killed before they wrote theirs. Cannot hang: every rank writes its record before
    it waits here (in main's `finally`), and the wait ends after `limit_s` whatever it finds."""
    paths = [os.path.join(out_dir, f"rank{r}.json") for r in range(int(os.environ["WORLD_SIZE"]))]
    deadline = time.monotonic() + limit_s
    while not all(os.path.exists(p) for p in paths) and time.monotonic() < deadline:
        time.sleep(0.05)


def main(spec_path: str, out_dir: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    rank = int(os.environ["RANK"])
    if spec.get("hang"):  # for the harness's own test: rank 0 waits in a barrier that rank 1 never joins
        with open(os.path.join(out_dir, f"pid{rank}"), "w") as f:
            f.write(str(os.getpid()))
        dist.init_process_group("gloo")
        if rank == 0:
            dist.barrier()
        time.sleep(3600)
    if spec.get("crash") and rank == 1:  # for the harness's own test: a rank that dies of a crash signal
        marker = os.path.join(os.path.dirname(out_dir), "crashed")
        if not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGSEGV)
    seen = {"errors": [], "results": {}}

    def write():
        path = os.path.join(out_dir, f"rank{rank}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(seen, f)
        os.replace(path + ".tmp", path)  # whole or absent: another rank waits for it to exist (_await_records)

    try:
        _expect_errors(spec.get("errors_before", []), seen["errors"], spec.get("raise", False))
        for job in spec.get("jobs", []):
            _run_job(job, seen["results"])
        _expect_errors(spec.get("errors_after", []), seen["errors"], False)
    finally:
        write()
        if spec.get("raise"):
            _await_records(out_dir)
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET") == "1":  # the Triton kernels in the interpreter, as in the kernel tests
        from support.triton_interpreter import patch_interpreter  # tests/ is on its path (test_tp.py)

        patch_interpreter()
    main(sys.argv[1], sys.argv[2])
