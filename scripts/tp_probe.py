"""The GPU proof of tensor parallelism, for a host with two GPUs:

    torchrun --nproc-per-node 2 scripts/tp_probe.py --out DIR [--parts equal,speed,big]

The figures of docs/TENSOR_PARALLEL.md (results/h200/*-tp2-*; each report.md gives its exact command), e.g.:

    torchrun --nproc-per-node 2 scripts/tp_probe.py --out results/h200/llama-8b-tp2-fused --parts speed \
        --strategy fused --part-timeout 170

Parts (every rank runs every part; a tp=1 run happens on rank 0 alone while rank 1 waits at a CPU barrier):
- equal: llama-1b-random, float32, batch 1, 200 new tokens: the tokens of tp=2 (eager `static`, compiled
  `interleaved`; --equal-strategies adds `fused`) against tp=1 `static` on rank 0, the same random weights
  (random_init.py: shard-independent draws), and whether both ranks got the same tokens; a seeded sampling
  call too. Where tokens differ: the step, and tp=1's top-two logit margin there (a near-tie shows as a
  tiny margin).
- speed: llama-8b-random, bfloat16, batch 1: ms/token of tp=1 (rank 0) and tp=2, and their ratio
  (`bytes_read_per_token` counts the fused step's LM-head rows only, unless --replicated-head).
- big: llama-70b-random, bfloat16, tp=2: ms/token, weight bytes per GPU, achieved bandwidth and MBU
  (bytes read per token / time / peak), against the spec peak and a measured device copy.
ms/token is reported two ways: the whole call / new tokens (as `overlapdecode bench`), and the decode steps
alone ((call of N - call of 1) / (N - 1)). Rank 0 writes DIR/tp.json after every part, so a later failure
keeps the earlier results; a part that runs past --part-timeout dumps every thread's stack and exits.

Exit: destroy_process_group() has hung at exit under torchrun on the GPU machine, so after a CPU barrier
every rank leaves with os._exit (output flushed first), skipping the NCCL teardown.
`--device cpu` (gloo) with `--models tiny-llama,tiny-llama,tiny-llama` runs the same control flow on CPU.

On a device machine whose commands are limited to 10 minutes, run the parts one per command
(`--parts equal`, `--parts speed`, `--parts big`, each its own --out): the 70B compile alone takes minutes.
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from datetime import timedelta

# Before NCCL starts: no NVLink SHARP multicast (NVLS), no multicast symmetric memory (see KINDS.md).
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("TORCH_NCCL_AVOID_RECORD_STREAMS", "1")  # no allocator holds on NCCL's buffers

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import overlapdecode as od  # noqa: E402
from overlapdecode.bench.worker import device_bandwidth_gbs  # noqa: E402
from overlapdecode.facts import weight_bytes  # noqa: E402
from overlapdecode.tp import VocabShard, is_sharded  # noqa: E402

PROMPT_LEN = 16
PARTS = ("equal", "speed", "big")  # in this order in --models


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--out", required=True, help="directory: rank 0 writes DIR/tp.json, a failing rank DIR/tp.json.rankN.error.txt"
    )
    p.add_argument("--parts", default="equal,speed,big")
    p.add_argument(
        "--models",
        default="llama-1b-random,llama-8b-random,llama-70b-random",
        help="the models of equal, speed and big",
    )
    p.add_argument("--new-tokens", type=int, default=200)
    p.add_argument("--speed-tokens", type=int, default=200)
    p.add_argument("--strategy", default="interleaved", help="the strategy timed in speed and big")
    p.add_argument(
        "--equal-strategies",
        default="static,interleaved",
        help="the tp strategies whose tokens equal compares with tp=1 static (add fused: one more compile)",
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--peak-gbps", type=float, default=4800.0, help="spec memory bandwidth (H200: 4.8 TB/s)")
    p.add_argument("--part-timeout", type=float, default=540.0, help="seconds before a part is declared hung")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument(
        "--one-shot",
        action="store_true",
        help="experiment: let inductor lower the compiled step's all-reduces of <= 128 KiB to symmetric "
        "memory's one-shot all-reduce (peers' buffers read over NVLink, no NCCL launch)",
    )
    p.add_argument(
        "--replicated-head",
        action="store_true",
        help="fused under tp: every rank reads the whole LM head (FusedModel(vocab_parallel=False)) "
        "instead of its rows with a gather of the logits (the default)",
    )
    p.add_argument(
        "--symmetric-all-reduce",
        action="store_true",
        help="fused: sum the decode step's partial products by the one-shot all-reduce over symmetric "
        "memory (FusedModel(symmetric_all_reduce=True)) instead of NCCL",
    )
    args = p.parse_args(argv)
    # refused here, on every rank, before any device work: found at their part, they ended a run only after
    # the earlier parts had taken their minutes of GPU time
    unknown = sorted(set(args.parts.split(",")) - set(PARTS))
    if unknown:
        p.error(f"--parts: unknown part(s) {', '.join(map(repr, unknown))}; the parts are {', '.join(PARTS)}")
    if len(args.models.split(",")) != len(PARTS):
        p.error(
            f"--models takes {len(PARTS)} comma-separated names, the models of {', '.join(PARTS)}; got {args.models!r}"
        )
    if "RANK" not in os.environ:
        p.error("run it under torchrun: torchrun --nproc-per-node 2 scripts/tp_probe.py --out DIR ...")
    if args.symmetric_all_reduce and args.device == "cpu":
        p.error("--symmetric-all-reduce needs CUDA (symmetric memory)")
    if args.one_shot and args.device == "cpu":
        p.error("--one-shot needs CUDA (symmetric memory)")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        p.error(f"--out {args.out} is a file, not a directory")
    args.json = os.path.join(args.out, "tp.json")
    if os.path.exists(args.json):
        p.error(f"{args.json} exists: choose a new --out (no run overwrites an earlier one)")
    os.makedirs(args.out, exist_ok=True)
    return args


class Probe:
    def __init__(self, args):
        self.args = args
        self.cuda = args.device == "cuda"
        self.rank = int(os.environ["RANK"])
        self.device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if self.cuda else torch.device("cpu")
        timeout = timedelta(seconds=args.part_timeout + 60)
        if self.cuda:
            torch.cuda.set_device(self.device)
            dist.init_process_group("nccl", device_id=self.device, timeout=timeout)
        else:
            dist.init_process_group("gloo", timeout=timeout)
        self.tp = dist.get_world_size()
        if args.one_shot:
            # imported here: only this experiment needs them
            import torch._inductor.config as inductor_config  # noqa: PLC0415
            from torch.distributed._symmetric_memory import enable_symm_mem_for_group  # noqa: PLC0415

            enable_symm_mem_for_group(dist.group.WORLD.group_name)  # collective: every rank
            inductor_config._collective.auto_select = True
        self.cpu_group = dist.new_group(backend="gloo", timeout=timeout)  # barriers that hold no GPU
        self.report = dict(env=self.environment(), parts={})

    def environment(self) -> dict:
        env = dict(
            torch=torch.__version__,
            world_size=dist.get_world_size(),
            device=self.args.device,
            argv=sys.argv,
            commit=os.environ.get("OVERLAPDECODE_COMMIT"),
            one_shot=self.args.one_shot,
            symmetric_all_reduce=self.args.symmetric_all_reduce,
            replicated_head=self.args.replicated_head,
        )
        if env["commit"] is None:
            try:
                env["commit"] = (
                    subprocess.run(
                        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
                    ).stdout.strip()
                    or None
                )
            except (OSError, subprocess.SubprocessError):
                pass
        if self.cuda:
            env.update(
                gpu=torch.cuda.get_device_name(self.device),
                nccl=".".join(map(str, torch.cuda.nccl.version())),
                nccl_env={k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "TORCH_NCCL", "TORCH_SYMM"))},
            )
        return env

    def barrier(self):
        dist.barrier(group=self.cpu_group)

    def write(self):
        if self.rank == 0:
            tmp = self.args.json + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.report, f, indent=1)
            os.replace(tmp, self.args.json)

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)  # host sync: timing boundary

    def load(self, name, dtype, tp):
        t = time.perf_counter()
        model = od.load_model(name, dtype=dtype, device=self.device, tp=tp)  # tp=1 runs on rank 0: cuda:0
        self.sync()
        return model, time.perf_counter() - t

    def release(self):
        """After the caller dropped its model: its kept caches go with it (they hang off the model or its
        decoder); compiled graphs hold it through their guards until dynamo is reset."""
        torch._dynamo.reset()
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()

    def prompt(self, model):
        """The same batch-1 prompt on every rank and for every tp (a seeded CPU generator)."""
        g = torch.Generator().manual_seed(0)
        return torch.randint(0, model.config.vocab_size, (1, PROMPT_LEN), generator=g).to(self.device)

    def generate(self, model, ids, n, strategy, **kw):
        """od.generate through the decoder it keeps for `model`, carrying --symmetric-all-reduce to the fused step
        of a sharded model (set before that decoder makes its FusedModel: the first fused call; a tp=1 model has
        no all-reduce, and FusedModel refuses the option there)."""
        dec = od.decoder_for(model)
        if self.args.symmetric_all_reduce and is_sharded(model):
            dec.fused_options["symmetric_all_reduce"] = True
        if self.args.replicated_head and is_sharded(model):
            dec.fused_options["vocab_parallel"] = False
        mask = torch.ones_like(ids)  # unpadded: never a mask inferred from a pad id among random ids
        return dec.generate(ids, attention_mask=mask, max_new_tokens=n, strategy=strategy, eos_token_id=[], **kw)

    def timed(self, fn):
        self.sync()
        t = time.perf_counter()
        out = fn()
        self.sync()
        return time.perf_counter() - t, out

    def speed(self, model, n) -> dict:
        """First call (compile, capture), then the median of repeats of a call of n and of 1 token."""
        ids = self.prompt(model)
        strategy = self.args.strategy
        first, _ = self.timed(lambda: self.generate(model, ids, n, strategy))
        self.generate(model, ids, 1, strategy)
        full = statistics.median(
            self.timed(lambda: self.generate(model, ids, n, strategy))[0] for _ in range(self.args.repeats)
        )
        one = statistics.median(
            self.timed(lambda: self.generate(model, ids, 1, strategy))[0] for _ in range(self.args.repeats)
        )
        return dict(
            strategy=strategy,
            new_tokens=n,
            first_call_s=first,
            call_s=full,
            one_token_call_s=one,
            ms_per_token=full * 1e3 / n,
            decode_ms_per_token=(full - one) * 1e3 / (n - 1),
        )

    def bytes_per_gpu(self, model) -> dict:
        total = weight_bytes(model)  # as the bench counts them: each storage once
        emb = model.get_input_embeddings().weight
        head = model.get_output_embeddings().weight
        tied = emb is head
        # a step reads every weight but the embedding table, of which it reads B rows
        read = total - (0 if tied else emb.numel() * emb.element_size())
        if self.args.strategy == "fused" and is_sharded(model) and not self.args.replicated_head:
            # the fused step reads only this rank's rows of the LM head (as FusedModel shards it)
            lo, hi = VocabShard("", self.rank, self.tp, head.shape[0]).rows
            read -= (head.shape[0] - (hi - lo)) * head.shape[1] * head.element_size()
        return dict(weight_bytes_per_gpu=total, bytes_read_per_token=read)

    def margin_at(self, model, ids, tokens, step) -> float:
        """tp=1's top-two logit gap where the runs part: a near-tie explains a flip of the argmax."""
        seq = torch.tensor([tokens[: PROMPT_LEN + step]], device=ids.device)
        with torch.no_grad():
            top = model(input_ids=seq).logits[0, -1].float().topk(2).values
        return float(top[0] - top[1])

    # ---- parts ----

    def part_equal(self, name):
        args = self.args
        n = args.new_tokens
        res = dict(model=name, dtype="float32", new_tokens=n)
        ref = model1 = None
        if self.rank == 0:
            model1, res["load_tp1_s"] = self.load(name, "float32", 1)
            ids = self.prompt(model1)
            ref = self.generate(model1, ids, n, "static")[0].tolist()
            ref_sample = self.generate(model1, ids, 32, "static", do_sample=True, seed=7, top_k=50)[0].tolist()
        self.barrier()
        model, res["load_tp2_s"] = self.load(name, "float32", self.tp)
        ids = self.prompt(model)
        runs = {s: self.generate(model, ids, n, s)[0].tolist() for s in args.equal_strategies.split(",")}
        runs["sample-static"] = self.generate(model, ids, 32, "static", do_sample=True, seed=7, top_k=50)[0].tolist()
        gathered = [None] * self.tp
        dist.all_gather_object(gathered, runs, group=self.cpu_group)
        if self.rank == 0:
            for key, toks in runs.items():
                want = ref_sample if key.startswith("sample") else ref
                diff = next((i for i, (a, b) in enumerate(zip(toks, want)) if a != b), None)
                entry = dict(equal_tp1=toks == want, ranks_agree=all(g[key] == toks for g in gathered))
                if diff is not None and not key.startswith("sample"):
                    entry.update(
                        first_diff_step=diff - PROMPT_LEN,
                        tp1_top2_margin=self.margin_at(model1, ids, want, diff - PROMPT_LEN),
                    )
                res[key] = entry
            res["all_equal"] = all(v["equal_tp1"] and v["ranks_agree"] for k, v in res.items() if isinstance(v, dict))
        del model1, model
        self.release()
        return res

    def part_speed(self, name):
        n = self.args.speed_tokens
        res = dict(model=name, dtype="bfloat16", batch=1)
        if self.rank == 0:
            model1, load_s = self.load(name, "bfloat16", 1)
            res["tp1"] = dict(self.speed(model1, n), load_s=load_s, **self.bytes_per_gpu(model1))
            del model1
            self.release()
        self.barrier()
        model, load_s = self.load(name, "bfloat16", self.tp)
        mine = dict(self.speed(model, n), load_s=load_s, **self.bytes_per_gpu(model))
        gathered = [None] * self.tp
        dist.all_gather_object(gathered, mine, group=self.cpu_group)
        res[f"tp{self.tp}"] = gathered[0]
        res[f"tp{self.tp}_per_rank_ms_per_token"] = [g["ms_per_token"] for g in gathered]
        if self.rank == 0:
            for key in ("ms_per_token", "decode_ms_per_token"):
                res[f"ratio_{key}"] = gathered[0][key] / res["tp1"][key]
        del model
        self.release()
        return res

    def copy_gbps(self) -> float | None:
        """Measured device bandwidth: the bench's own device-to-device copy (one definition of MBU's ceiling)."""
        return device_bandwidth_gbs(self.device) if self.cuda else None

    def part_big(self, name):
        res = dict(model=name, dtype="bfloat16", batch=1, tp=self.tp, measured_copy_gbps=self.copy_gbps())
        model, res["load_s"] = self.load(name, "bfloat16", self.tp)
        res.update(self.bytes_per_gpu(model))
        if self.cuda:
            res["peak_allocated_gb_after_load"] = torch.cuda.max_memory_allocated(self.device) / 1e9
        res.update(self.speed(model, self.args.speed_tokens))
        for key in ("ms_per_token", "decode_ms_per_token"):
            gbps = res["bytes_read_per_token"] / (res[key] / 1e3) / 1e9
            res[f"achieved_gbps_{key}"] = gbps
            res[f"mbu_{key}"] = gbps / self.args.peak_gbps
            if res["measured_copy_gbps"]:
                res[f"mbu_vs_copy_{key}"] = gbps / res["measured_copy_gbps"]
        if self.cuda:
            res["peak_allocated_gb"] = torch.cuda.max_memory_allocated(self.device) / 1e9
        del model
        self.release()
        return res

    def run(self):
        names = dict(zip(PARTS, self.args.models.split(",")))
        for part in self.args.parts.split(","):
            self.report["running"] = part
            self.write()
            # A hang (a rank waiting in a collective) dumps every stack and ends this process; torchrun then
            # ends the other. An error does the same through main(): after a failed part the ranks' sequences
            # of collectives no longer match, so no later part may run.
            faulthandler.dump_traceback_later(self.args.part_timeout, exit=True)
            t = time.perf_counter()
            try:
                res = getattr(self, f"part_{part}")(names[part])
            except Exception as err:
                self.report["parts"][part] = dict(error=f"{type(err).__name__}: {err}")
                raise
            finally:
                faulthandler.cancel_dump_traceback_later()
            res["wall_s"] = time.perf_counter() - t
            self.report["parts"][part] = res
            print(f"[rank {self.rank}] {part}: {json.dumps(res)}", flush=True)
            self.barrier()
        self.report.pop("running", None)
        self.write()


def main():
    args = parse_args()
    probe = Probe(args)
    try:
        probe.run()
    except BaseException:
        traceback.print_exc()
        with open(f"{args.json}.rank{probe.rank}.error.txt", "w") as f:
            f.write(f"part: {probe.report.get('running')}\n")
            traceback.print_exc(file=f)
        probe.write()  # rank 0: the parts done so far, and the error
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # no barrier: the other rank may be inside a collective; torchrun ends it
    sys.stdout.flush()
    sys.stderr.flush()
    probe.barrier()  # every rank is done with NCCL before any leaves
    os._exit(0)


if __name__ == "__main__":
    main()
