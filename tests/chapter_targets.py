"""Every launch target of the chapters, fn(rank, world, cfg), with a small cfg that runs in
about a second: what the fake-GPU test (tests/test_fake_cuda.py) and the world-1 NCCL sweep
(scripts/world1_sweep.py) run. `targets(tmp)` lists them as Target rows; a new launch target
in helpers must be added here (tests/test_fake_cuda.py checks that none is missing).

owner: who keeps the target's device and timing right (the course's areas: "core" = runtime,
sharding, tensor and pipeline parallelism; "part4" = Part IV's data parallelism; "part3" =
Part III; "part7" = Part VII). world: the number of ranks it runs on here. world1: what the
world-1 sweep changes in its cfg to run on one rank (None: it needs more ranks). gloo_only: a
target that its chapters launch with backend="gloo" (it never sees a GPU: timing gloo, or a
lesson on what gloo raises). data: it reads Fashion-MNIST.

`each(rank, world, cfg)` is a launch target running cfg["runs"] in turn, each failure reported
(not raised): the world-1 sweep's, where no peer can be left waiting.
"""
import functools
import os
import time
import traceback
from dataclasses import dataclass, field

import helpers as h
from helpers.data_parallel.dp_vs_ddp_experiments import ddp_step_seconds
from helpers.data_parallel.scratch_experiments import scratch_skipped_step
from helpers.data_parallel.speed_experiments import (
    allreduce_compare_worker,
    bench_worker,
    dp_timing_worker,
    gloo_allreduce_worker,
)
from helpers.runtime.launch import run_in_turn, take

SMALL_MLP = dict(d_in=16, width=32, depth=3, d_out=10)
ZERO_MLP = dict(d_in=16, width=32, depth=3)     # make_model("mlp")'s sizes
BLOCK = dict(width=16, heads=4)
INPUTS = dict(batch=2, seq=6, width=16)
LM = dict(model=dict(vocab=32, width=16, heads=4), batch=2, seq=6)
MESH_INPUTS = dict(batch=4, seq=4, width=16)
GPT = dict(vocab=16, width=16, layers=2, heads=2, seq=8)
MOE = dict(width=8, hidden=16, n_experts=4, k=2)
CP = dict(attention=dict(B=1, H=2, T=16, D=4, causal=True, layouts=("contiguous", "zigzag")),
          ulysses=dict(B=1, H=2, T=16, D=4, causal=True),
          memory=dict(width=8, heads=2, batch=1, seqs=[8, 16]),
          torch=dict(width=8, heads=2, batch=1, T=8))
EP = dict(equal=dict(moe=MOE, tokens=32, factors=[1.25, None]),
          imbalance=dict(moe=MOE, tokens=32, skews=[0.0, 4.0], factors=[1.25], repeats=1),
          production=dict(moe=dict(MOE, shared_hidden=8), tokens=16, ep=2))
THREE_D = dict(shape=(1, 2, 1), model=GPT, batch=4, m=2, steps=1)   # (pp, dp, tp)
PIPE_NET = dict(vocab=64, width=16, depth=4)
FREE = dict(flops_per_s=50e12, alpha=0.0, beta=float("inf"), source="free messages")


@dataclass
class Target:
    name: str
    fn: object
    cfg: dict
    owner: str = "core"
    world: int = 2
    gloo_only: bool = False
    data: bool = False
    notes: str = ""
    world1: dict = field(default_factory=dict)


def targets(tmp):
    """The rows (tmp: a folder for checkpoints and traces)."""
    ck = os.path.join(tmp, "ck")
    pipe = dict(net=PIPE_NET, batch_size=8, seed=0, m=2, cuts=[3], rates=FREE)
    one = dict(cuts=[])                                       # world1: one stage
    T = Target
    return [
        # Part III
        T("ddp_vs_one_process", h.ddp_vs_one_process,
          dict(cases=[("mlp", None), ("tied", 0.01)], num_steps=2), "part3"),
        T("unused_vs_torch", h.unused_vs_torch, {}, "part3"),
        T("accumulation_vs_torch", h.accumulation_vs_torch, {}, "part3"),
        T("scratch_refusals", h.scratch_refusals, {}, "part3"),
        T("scratch_skipped_step", scratch_skipped_step, dict(timeout=2), "part3",
          gloo_only=True, notes="waits for a timeout that NCCL's watchdog would turn into a "
                                "killed process: a gloo lesson"),
        T("gradient_timeline", h.gradient_timeline, {}, "part3"),
        T("overlap_step_times", h.overlap_step_times, dict(rounds=2, warmup=1), "part3"),
        T("exposed_comm_times", h.exposed_comm_times, dict(rounds=2, warmup=1), "part3"),
        T("ddp_scratch_trace", h.ddp_scratch_trace, dict(steps=2), "part3"),
        T("emulated_overlap", h.emulated_overlap, dict(steps=1), "part3"),
        T("bn_vs_syncbn", h.bn_vs_syncbn, dict(subset=256, batch_size=32, num_steps=2,
                                               lr=0.05, seed=0), "part3", data=True),
        T("syncbn_cost_times", h.syncbn_cost_times,
          dict(subset=256, rounds=1, warmup=1, steps=1), "part3", data=True),
        T("ddp_step_seconds", ddp_step_seconds, dict(batch=8, steps=1), "part3"),
        T("syncbn_traffic", h.syncbn_traffic, dict(batch=4, channels=4, size=6), "part3",
          gloo_only=True, notes="launched with backend=\"gloo\": records the CPU stand-in's "
          "collectives for the schematic"),
        T("uneven_inputs_join", h.uneven_inputs_join, {}, "part3", gloo_only=True,
          notes="launched with backend=\"gloo\": a lesson on collectives"),
        # Part IV (part4)
        T("ddp_knobs", h.ddp_knobs, dict(width=32, depth=2, batch=8, steps=1, rounds=1),
          "part4"),
        T("ddp_trace", h.ddp_trace, dict(trace_dir=tmp, width=32, depth=2, batch=8,
                                         bucket_mb=0.05, steps=1), "part4"),
        T("bench_worker", bench_worker, dict(wrappers=["ddp", "scratch"], batch_size=64,
                                               lr=0.2, num_epochs=1, subset=256, seed=0),
          "part4", data=True),
        T("train_fast_rank", h.train_fast_rank, dict(batch_size=64, lr=0.2, num_epochs=1,
                                                     subset=256, seed=0), "part4", data=True),
        T("gloo_allreduce_worker", gloo_allreduce_worker, dict(sizes=[1024], reps=2),
          "part4"),
        T("dp_timing_worker", dp_timing_worker,
          dict(ks=[1, 2], runs=[dict(name="b", global_batch=8, steps=1, reps=1)], subset=256),
          "part4", gloo_only=True, data=True, notes="times data parallelism on CPU cores"),
        T("allreduce_compare_worker", allreduce_compare_worker,
          dict(shapes=[(5,), (3, 4)], seed=0), "part4"),
        # Part V (gpu)
        T("zero1_vs_one_process", h.zero1_vs_one_process, dict(num_steps=2)),
        T("zero2_vs_one_process", h.zero2_vs_one_process, dict(num_steps=2)),
        T("fsdp_scratch_vs_one_process", h.fsdp_scratch_vs_one_process,
          dict(kind="mlp", num_steps=2)),
        T("fsdp_scratch_vs_one_process:bf16", h.fsdp_scratch_vs_one_process,
          dict(kind="lm", optim="sgd", compute_dtype="bfloat16", num_steps=2)),
        T("fsdp2_vs_one_process", h.fsdp2_vs_one_process, dict(num_steps=2)),
        T("dcp_save_sharded", h.dcp_save_sharded, dict(path=ck)),
        T("dcp_load_resharded", h.dcp_load_resharded, dict(path=ck)),
        T("memory_per_stage", h.memory_per_stage, {}),
        T("zero1_checkpoint", h.zero1_checkpoint, dict(path=ck + ".zero1")),
        T("zero2_accumulation", h.zero2_accumulation, dict(micro=2, num_steps=1)),
        T("clip_over_shards", h.clip_over_shards, dict(num_steps=2)),
        T("fsdp_knobs", h.fsdp_knobs, dict(num_steps=1)),
        T("mixed_precision_zero", h.mixed_precision_zero, dict(num_steps=2)),
        T("refusals", h.refusals, {}),
        T("offload_run", h.offload_run, dict(sizes=ZERO_MLP, num_steps=1)),
        T("qwz_vs_all_gather", h.qwz_vs_all_gather, dict(sizes=ZERO_MLP, block=16)),
        # Part VI (gpu)
        T("tp_worker", h.tp_worker, dict(block=BLOCK, inputs=INPUTS, lm=LM)),
        T("mesh2d_worker", h.mesh2d_worker, dict(block=BLOCK, inputs=MESH_INPUTS, steps=1,
                                                 shape=(1, 2)), world1=dict(shape=(1, 1))),
        T("hsdp_worker", h.hsdp_worker, dict(block=BLOCK, inputs=MESH_INPUTS, steps=1),
          world=4, world1=None),
        T("pipeline_run", h.pipeline_run, dict(pipe, schedule="gpipe"), world1=one),
        T("pipeline_run:1f1b", h.pipeline_run, dict(pipe, schedule="1f1b"), world1=one),
        T("pipeline_run:zb", h.pipeline_run, dict(pipe, schedule="zb"), world1=one),
        T("pipeline_run:emulated", h.pipeline_run,
          dict(pipe, schedule="1f1b", emulate=1e6, equal=True), world1=one),
        T("pipelining_run", h.pipelining_run, dict(pipe, schedule="Schedule1F1B"),
          world1=one),
        T("pipelining_run:emulated", h.pipelining_run,
          dict(pipe, schedule="ScheduleGPipe", emulate=1e6), world1=one),
        T("pingpong_run", h.pingpong_run, dict(shape=(4, 16), repeats=2), world1=None),
        # Part VII (part7)
        T("cp_attention_run", h.cp_attention_run, CP["attention"], "part7"),
        T("cp_ulysses_run", h.cp_ulysses_run, CP["ulysses"], "part7"),
        T("cp_activation_memory", h.cp_activation_memory, CP["memory"], "part7"),
        T("cp_torch_run", h.cp_torch_run, CP["torch"], "part7"),
        T("ep_equal_run", h.ep_equal_run, EP["equal"], "part7"),
        T("ep_imbalance_run", h.ep_imbalance_run, EP["imbalance"], "part7"),
        T("ep_production_run", h.ep_production_run, EP["production"], "part7",
          world1=dict(ep=1)),
        T("train_3d_scratch", h.train_3d_scratch, THREE_D, "part7",
          world1=dict(shape=(1, 1, 1))),
        T("train_3d_torch", h.train_3d_torch, THREE_D, "part7",
          world1=dict(shape=(1, 1, 1))),
        T("train_cp_zero2", h.train_cp_zero2, dict(shape=(1, 2), model=GPT, batch=2, steps=1,
                                                   recomputes=("none",)), "part7",
          world1=dict(shape=(1, 1))),
    ]


# launch targets that are parts of another (run through it), or harness plumbing
COVERED_BY = {"run_in_turn": "every target (helpers.run_ranks)",
              "vocab_runs": "tp_worker (lm=...)", "sp_runs": "tp_worker",
              "bn_grads_same_weights": "bn_vs_syncbn (the same DDP and SyncBatchNorm set-up, "
              "states given)"}


def _captured(fn, rank, world, cfg):
    """fn(rank, world, cfg), reported rather than raised: {error (None: it ran), seconds}."""
    t0 = time.perf_counter()
    try:
        fn(rank, world, cfg)
        error = None
    except Exception as e:   # reported per target
        lines = traceback.format_exc().strip().splitlines()
        error = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}" if str(e) \
            else type(e).__name__
        error += "\n     at " + next((ln.strip() for ln in reversed(lines)
                                    if ln.strip().startswith("File") and "/helpers/" in ln),
                                   lines[-1].strip() if lines else "?")
    return dict(error=error, seconds=time.perf_counter() - t0)


def each(rank, world, cfg):
    """Launch target: every (label, fn, kwargs) of cfg["runs"] in turn on this rank (the
    runtime's run_in_turn), each one's failure reported, not raised; returns {label:
    dict(error, seconds)}. For one rank only (a failure here would leave a peer waiting in a
    collective)."""
    if world != 1:
        raise ValueError("chapter_targets.each runs on one rank: launch it with world 1")
    (runs,) = take(cfg, "runs")
    captured = [(label, functools.partial(_captured, fn), kw) for label, fn, kw in runs]
    return run_in_turn(rank, world, dict(cfg, runs=captured))
