"""`overlapdecode bench`: run the sweep, one worker process per allocator setting, then write the report.

With `gpus` (several GPUs of one host) the sweep is cut into units of one allocator and one dtype:batch
pair, each a worker pinned to one GPU by CUDA_VISIBLE_DEVICES, at most one per GPU at a time: every figure
is still measured by a process that has its GPU to itself, and the rows are merged into one results.json.
Most of these loops are bound by the host (Python and kernel launches), so each GPU's worker also gets its own
share of the CPU cores (affinity, OpenMP and inductor compile threads): without that, one unit compiling
on every core disturbs the timing of the others.

DIR/results.json holds every row with the machine, versions, git commit, allocator, dtype, batch and
length beside it, plus the command that made it; DIR/report.md and the plots are built from that file
alone (report.py), so `overlapdecode report DIR` rebuilds them anywhere.
"""

from __future__ import annotations

import glob
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .config import BenchConfig, config_json, plan
from .report import outdir, report
from .report.results import RESULTS, ResultsError, finalize, load, rows_files

ALLOCATORS = {"default": None, "expandable": "expandable_segments:True"}


class BenchError(RuntimeError):
    pass


class BenchInterrupted(BenchError):
    """Ctrl-C (or SIGTERM: Terminated) during a run: the workers were stopped, what they measured kept (the message
    says where). `reason`: "Ctrl-C" or "SIGTERM"."""

    def __init__(self, message: str, reason: str = "Ctrl-C"):
        super().__init__(message)
        self.reason = reason


class Terminated(KeyboardInterrupt):
    """SIGTERM during a run (a time limit's `timeout`, a job scheduler, `kill`), raised in the main thread by the
    command line's handler (cli/bench.py) so that it ends a run as Ctrl-C does: workers stopped, rows kept. Without
    it the bench died at once and its measured rows never reached results.json."""


class Workers:
    """The worker processes of one run, so that Ctrl-C can stop them all and no unit starts after it."""

    def __init__(self):
        self._lock = threading.Lock()
        self._procs: list[subprocess.Popen] = []
        self.stopped = False

    def start(self, cmd, env, log) -> subprocess.Popen | None:
        """A new worker process, or None once the run is stopped."""
        with self._lock:
            if self.stopped:
                return None
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
            self._procs.append(proc)
            return proc

    def stop(self, grace_s: float = 10.0) -> None:
        """Start no more workers; end the running ones (SIGTERM, then SIGKILL after `grace_s`)."""
        with self._lock:
            self.stopped = True
            procs = list(self._procs)
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def cpu_shares(slots: int) -> list[list[int] | None]:
    """Disjoint sets of the CPU cores this process may use, one per GPU slot; None (no pinning) for a single
    slot or where the OS cannot pin (no sched_setaffinity)."""
    if slots <= 1 or not hasattr(os, "sched_setaffinity"):
        return [None] * max(slots, 1)
    cpus = sorted(os.sched_getaffinity(0))
    k = max(1, len(cpus) // slots)
    return [cpus[i * k : (i + 1) * k] or cpus for i in range(slots)]


def _last_line(path: str) -> str:
    """The last non-empty line of a worker's log: the exception of a traceback."""
    try:
        with open(path, errors="replace") as f:
            lines = [line.strip() for line in f if line.strip()]
    except OSError:
        return "no log"
    return lines[-1] if lines else "nothing in its log"


def _worker(
    workers: Workers,
    cfg_path: str,
    rows_path: str,
    allocator: str,
    log_path: str,
    on_line,
    gpu: int | None = None,
    cpus: list[int] | None = None,
    tp_port: int | None = None,
) -> None:
    env = os.environ.copy()
    if tp_port is not None:
        # a tensor-parallel unit: this rank's worker joins the same unit's worker on every other rank through
        # a store of its own (rank 0's worker hosts it), not torchrun's, whose keys an earlier unit has used
        env["MASTER_PORT"] = str(tp_port)
        env["TORCHELASTIC_USE_AGENT_STORE"] = "False"
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("PYTORCH_ALLOC_CONF", None)
    if ALLOCATORS[allocator]:
        env["PYTORCH_ALLOC_CONF"] = ALLOCATORS[allocator]  # before CUDA starts: a new process
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)  # the worker sees this one GPU as cuda:0
    if cpus is not None:  # the worker pins itself (worker.main) before any thread starts
        env["OVERLAPDECODE_CPUS"] = ",".join(map(str, cpus))
        env["OMP_NUM_THREADS"] = env["TORCHINDUCTOR_COMPILE_THREADS"] = str(len(cpus))
    cmd = [sys.executable, "-m", "overlapdecode.bench.worker", "--config", cfg_path, "--out", rows_path]
    with open(log_path, "w") as log:
        proc = workers.start(cmd, env, log)
        if proc is None:  # the run was stopped before this unit started
            return
        for line in proc.stdout:
            on_line(line.rstrip("\n"))
        proc.wait()
    if proc.returncode != 0 and not workers.stopped:
        raise BenchError(
            f"the {allocator} worker failed (exit {proc.returncode}): {_last_line(log_path)} (its log: {log_path})"
        )


def work_units(cfg: BenchConfig) -> list[tuple[str, BenchConfig]]:
    """(label, config) per worker process: one per allocator; with `gpus`, one per allocator and dtype:batch
    pair, so that the units can run side by side on separate GPUs."""
    if not cfg.gpus:
        return [(a, replace(cfg, allocators=(a,))) for a in cfg.allocators]
    combos, _ = plan(cfg)
    return [
        (f"{a}-{d}-b{b}", replace(cfg, allocators=(a,), pairs=(f"{d}:{b}",), gpus=()))
        for a in cfg.allocators
        for d, b in combos
    ]


def run_bench(cfg: BenchConfig, out_dir: str, command: str, progress=True, append=False) -> dict | None:
    """Run the sweep into `out_dir` and build its report; returns the results dict.

    `append`: add the rows to those of an earlier run in `out_dir` (same model, prompt length and tp), so that
    one report covers sweeps too long for one go; every command is kept.

    `cfg.tp` > 1 (every rank of torchrun runs this): the ranks start the same units in the same order, so that
    their workers meet; rank 0 writes `out_dir`, the others measure into a scratch directory, drop it and
    return None.
    """
    problem = earlier = None
    try:
        earlier = _check_out_dir(cfg, out_dir, append)
    except BenchError as err:
        problem = str(err)
    if cfg.tp > 1:  # every rank stops, or none: a rank left alone would wait for its peers forever
        problem = _rank0_verdict(problem)
    if problem:
        raise BenchError(problem)
    if cfg.tp > 1 and int(os.environ["RANK"]) != 0:
        scratch = tempfile.mkdtemp(prefix=f"overlapdecode-bench-rank{os.environ['RANK']}-")
        try:
            _run_units(cfg, scratch, progress=False)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return None
    try:  # the manifest lists every file of the run before any is written
        outdir.prepare(out_dir, "bench", append, files=["config.json"] + _unit_files(cfg))
    except outdir.OutDirError as err:
        raise BenchError(str(err)) from None
    outdir.write_text(out_dir, "config.json", config_json(cfg), "bench")
    try:
        _run_units(cfg, out_dir, progress)
    except KeyboardInterrupt as stop:
        reason = "SIGTERM" if isinstance(stop, Terminated) else "Ctrl-C"
        raise BenchInterrupted(_keep_or_clear(out_dir, command, earlier, reason), reason) from None
    except BenchError as err:
        kept = _keep_or_clear(out_dir, command, earlier, f"a worker failed: {err}")
        raise BenchError(f"{err}; {kept}") from None
    results = finalize(out_dir, command, earlier)
    report.build(out_dir)
    return results


def _unit_files(cfg: BenchConfig) -> list[str]:
    """The files each work unit writes into the output directory: its config, its rows and its worker's log."""
    return [f"{kind}-{label}.{ext}" for label, _ in work_units(cfg) for kind, ext in _UNIT_FILES]


_UNIT_FILES = (("config", "json"), ("rows", "jsonl"), ("worker", "log"))


def _keep_or_clear(out_dir: str, command: str, earlier: dict | None, reason: str) -> str:
    """After a run that did not finish: its measured rows go into results.json and the report, marked
    interrupted with `reason`; without any, the run's rows and config files are removed (its worker logs
    stay), so that out_dir takes a new run as it is. Returns what became of them, as a sentence."""
    for path in glob.glob(os.path.join(out_dir, "config-*.json")):  # the units' own, left by a failed worker
        outdir.remove(out_dir, os.path.basename(path))
    try:
        results = finalize(out_dir, command, earlier, interrupted=True, reason=reason)
    except ResultsError:  # nothing measured: an earlier results.json, if any, is left as it was
        for path in rows_files(out_dir) + [os.path.join(out_dir, "config.json")]:
            outdir.remove(out_dir, os.path.basename(path))
        if earlier is not None:  # the earlier run's config, as --append found it
            outdir.write_json(out_dir, "config.json", earlier["config"], "bench")
            return f"nothing was measured; {out_dir} holds the earlier results as they were"
        return f"nothing was measured; {out_dir} can take a new run"
    report.build(out_dir)
    measured = sum("error" not in r for r in results["rows"])
    return (
        f"the {measured} measured rows are kept in {os.path.join(out_dir, RESULTS)} and "
        f"{os.path.join(out_dir, 'report.md')} (add to them with --append)"
    )


def _check_out_dir(cfg: BenchConfig, out_dir: str, append: bool) -> dict | None:
    """The results of an earlier run to append to (or None); a BenchError if out_dir cannot take this run
    (outdir.check: a new or empty directory, or one of an earlier bench run's)."""
    try:
        outdir.check(out_dir, "bench", append)
    except outdir.OutDirError as err:
        raise BenchError(str(err)) from None
    earlier = None
    if append:
        earlier = load(out_dir)
        was = (earlier["config"]["model"], earlier["config"]["prompt_len"], earlier["config"].get("tp", 1))
        if was != (cfg.model, cfg.prompt_len, cfg.tp):
            raise BenchError(
                f"--append: {out_dir} holds {was[0]} with prompt {was[1]} at tp={was[2]}, not "
                f"{cfg.model} with prompt {cfg.prompt_len} at tp={cfg.tp}"
            )
        weights = (earlier["config"].get("quantize"), earlier["config"].get("group_size", 128))
        if weights[0] != cfg.quantize or (cfg.quantize == "int4" and weights[1] != cfg.group_size):
            raise BenchError(
                f"--append: {out_dir} holds weights quantized {weights[0] or 'not at all'}"
                f"{f' (group {weights[1]})' if weights[0] == 'int4' else ''}, not as this run's --quantize asks"
            )
    if not plan(cfg)[1]:
        raise BenchError("nothing to measure: the configuration has no strategy, peer, dtype, batch or length")
    return earlier


def _rank0_verdict(problem: str | None) -> str | None:
    """Rank 0's check of the output directory, on every rank of a tensor-parallel bench (before any writes)."""
    import torch.distributed as dist  # torch only for a tensor-parallel run: the runner is torch-free otherwise

    if not dist.is_initialized():
        dist.init_process_group("gloo")  # torchrun's store; the workers meet through stores of their own
    box = [problem]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _run_units(cfg: BenchConfig, out_dir: str, progress: bool) -> None:
    """Every work unit's worker, their rows into out_dir/rows-*.jsonl; a BenchError if any failed."""
    units = work_units(cfg)
    workers = Workers()
    started = time.perf_counter()
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        disable=not progress,
        transient=False,
    ) as bar:
        tasks = {label: bar.add_task(f"[{label}] waiting", total=None) for label, _ in units}
        # not a terminal (a log file, a pipe): the bar is drawn once, at the end; a line per configuration as it
        # starts shows in the log where a long run is
        plain = progress and not bar.console.is_terminal
        free = queue.Queue()
        gpus = cfg.gpus or (None,)
        for slot in zip(gpus, cpu_shares(len(gpus))):
            free.put(slot)

        def run_unit(index, label, unit_cfg):
            task = tasks[label]
            slot = free.get()  # a unit waits for a GPU (and its CPU share) no other unit is measuring on
            try:
                if unit_cfg.time_budget_s is not None:  # the budget counts from the start of the whole bench
                    unit_cfg = replace(
                        unit_cfg, time_budget_s=max(0.0, unit_cfg.time_budget_s - (time.perf_counter() - started))
                    )
                cfg_path = outdir.write_text(out_dir, f"config-{label}.json", config_json(unit_cfg), "bench")

                def on_line(line):
                    if line.startswith("PLAN "):
                        bar.update(task, total=int(line.split()[1]), completed=0)
                    elif line.startswith("STEP "):
                        _, i, *what = line.split()
                        bar.update(task, completed=int(i), description=f"[{label}] {' '.join(what)}")
                        if plain:
                            seconds = time.perf_counter() - started
                            total = bar.tasks[task].total
                            bar.console.print(
                                f"[{label}] {int(i) + 1}/{total} {' '.join(what)} ({seconds:.0f} s)",
                                markup=False,
                                highlight=False,
                            )
                    elif line == "DONE":
                        bar.update(task, completed=bar.tasks[task].total, description=f"[{label}] done")

                # tensor parallel: the same unit on every rank meets at the same port (one unit at a time)
                tp_port = int(os.environ["MASTER_PORT"]) + 1 + index if cfg.tp > 1 else None
                _worker(
                    workers,
                    cfg_path,
                    os.path.join(out_dir, f"rows-{label}.jsonl"),
                    unit_cfg.allocators[0],
                    os.path.join(out_dir, f"worker-{label}.log"),
                    on_line,
                    *slot,
                    tp_port=tp_port,
                )
                outdir.remove(out_dir, os.path.basename(cfg_path))
            finally:
                free.put(slot)

        pool = ThreadPoolExecutor(max_workers=len(gpus))
        try:
            futures = [pool.submit(run_unit, i, label, unit_cfg) for i, (label, unit_cfg) in enumerate(units)]
            errors = [str(f.exception()) for f in futures if f.exception() is not None]
        except KeyboardInterrupt:  # the workers had Ctrl-C too (one process group), unless it came from kill or
            # was SIGTERM (Terminated): stop() ends them either way
            workers.stop()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    if errors:
        raise BenchError("; ".join(errors))
