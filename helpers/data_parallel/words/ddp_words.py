"""Part III's words for DDP and DataParallel (the dataparallel, ddp_scratch, ddp_torchrun and
custom_modules chapters): sentences chosen by a run's numbers, by what the machine had (GPUs,
dumps) or by the GPU reference run, each branch unit-tested, so no notebook cell picks them."""
from ...timing import Ratio
from ...words import plural

__all__ = ["dp_ddp_words", "timeline_clock_words", "exposed_words", "pending_words",
           "flight_recorder_words", "reference_dump_words", "nodes_same_words",
           "join_share_words", "walk_growth_words", "flag_cost_words", "flag_step_words"]


def dp_ddp_words(r=None, gpus=0, gpu_name="", ref=None):
    """DataParallel's step against DDP's: `r` (a Ratio, DataParallel's time over DDP's, timed
    here on `gpus` x `gpu_name`), else the GPU reference run's figure (`ref`, the dict of
    helpers.gpu_reference()), else a prediction that says why nothing was measured."""
    ref = ref or {}
    ref_dp = ref.get("paths", {}).get("train", {}).get("dp_vs_ddp")
    if r is not None:
        return (f"Here, on {gpus} x {gpu_name}, DataParallel's step took {r.median:.2f} times "
                f"DDP's (spread {r.lo:.2f} to {r.hi:.2f} over {plural(len(r.samples), 'round')}"
                f"): DDP was {r.word} DataParallel.")
    if ref_dp:
        rr = Ratio(ref_dp["ratio"]["samples"])
        return (f"In the GPU reference run ({ref['gpu']} x{ref['gpu_count']}, {ref['date']}), "
                f"DataParallel's step took {rr.median:.2f} times DDP's (spread {rr.lo:.2f} to "
                f"{rr.hi:.2f} over {plural(len(rr.samples), 'round')}): DDP was {rr.word} "
                "DataParallel.")
    return ("Not measured: this machine has fewer than 2 GPUs, and the GPU reference run "
            + ("had one GPU" if ref.get("exists") else "does not exist yet")
            + " (scripts/gpu_runner.sh records the figure on a machine with two). The "
            "prediction, from the costs listed above: DDP's step is the shorter for a model as "
            "small as LeNet, because DataParallel pays on every step for copying the weights, "
            "for its threads under one GIL and for the gather on GPU 0, which DDP does not pay.")


def timeline_clock_words(on_gpu):
    """Whose clock the gradient timeline's stamps are: CUDA events on GPUs, host times else."""
    if on_gpu:
        return ("These are the GPU's times, from CUDA events (the host only queues the work): "
                "each stamp is when the GPU got there, and a completion is an event that fires "
                "when NCCL's all-reduce has run.")
    return ("These are host times of gloo on the CPU, where an all-reduce runs on gloo's own "
            "threads. On GPUs with NCCL the host only queues the work, so there the same "
            "timeline is read from CUDA events: when the GPU got to each stamp, and when each "
            "all-reduce had run.")


def exposed_words(r):
    """The exposed time with overlap against every all-reduce after backward, from `r`, a
    Ratio of the after-backward time over the overlapped one, per round."""
    return {"faster": "shorter with overlap than with every all-reduce after backward",
            "slower": "longer with overlap than with every all-reduce after backward",
            "within noise": "within noise of the all-reduce-after-backward one: this run "
                            "cannot tell them apart",
            "cannot tell": "not told apart (one round) from the all-reduce-after-backward "
                           "one"}[r.verdict]


def pending_words(pending, num_buckets):
    """What the all-reduces not pending after backward did (counted, not timed): `pending` of
    `num_buckets` were left to wait for."""
    if pending < num_buckets:
        return "the others had completed during backward"
    return "none had completed during backward"


def flight_recorder_words(counts, unjoined):
    """What this run's flight recorder dumps show: `counts` ({rank: collectives recorded}, empty
    where nothing was dumped) and `unjoined` (sequence number, op, ranks that ran it; None
    where every rank recorded every collective)."""
    if not counts:
        return ("This torch's gloo records no collectives, so there was nothing to dump: the "
                "example needs NCCL (2 GPUs).")
    (first, n_first), *others = sorted(counts.items())
    recorded = f"Rank {first} recorded {plural(n_first, 'collective')}" + "".join(
        f" and rank {rank} {n}" for rank, n in others)
    if unjoined is None:
        return (f"{recorded}, and every collective was recorded by every rank: these dumps "
                "name no collective that a rank missed.")
    seq, op, ran = unjoined
    return (f"{recorded}: the first that not every rank recorded is number {seq} (`{op}`), run "
            f"by {_ranks(ran)} alone. torch's analyzer says the same (\"Not all ranks joining "
            f"collective\", with the missing rank and {_ranks(ran)}'s Python stack at the call), "
            "so the line to read is the one in that stack.")


def _ranks(ranks):
    """'rank 0', 'ranks 0 and 2': the ranks that ran a call."""
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + " and ".join(map(str, ranks))


def reference_dump_words(ref):
    """What the GPU reference run (helpers.gpu_reference()) recorded of NCCL's dumps, or why
    the NCCL case is a prediction."""
    fr = ref.get("paths", {}).get("torchrun", {}).get("flight_recorder", {})
    if fr.get("backend") == "nccl" and fr.get("first_unjoined"):
        return (f"On NCCL, in the GPU reference run ({ref['gpu']} x{ref['gpu_count']}, "
                f"{ref['date']}), the dumps named collective {fr['first_unjoined'][0]} "
                f"(`{fr['first_unjoined'][1]}`), run by rank 0 alone.")
    return ("On NCCL this is a prediction: the GPU reference run "
            + ("had one GPU, and NCCL needs one per rank" if ref.get("exists")
               else "does not exist yet")
            + ", so no NCCL dump has been recorded.")


def nodes_same_words(correct_two_nodes, correct_one_machine):
    """The two-node run's test result against the standalone run's, in test images."""
    gap = abs(correct_two_nodes - correct_one_machine)
    if gap == 0:
        return "the same test accuracy as"
    return f"{plural(gap, 'test image')} apart from"


def join_share_words(still, world):
    """The share of the step that a join hook's division by the starting world size gives:
    `still` ranks of `world` training ('half', else 'still/world')."""
    if 2 * still == world:
        return "half"
    return f"{still}/{world}"


def walk_growth_words(r):
    """The deep stack's graph walk against TwoInputNet's: `r` a Ratio of the deep walk's time
    over the small one's (every pair of calls)."""
    return {"faster": "longer than", "slower": "shorter than",
            "within noise": "not clearly different from",
            "cannot tell": "not told apart (one call each, no spread) from"}[r.verdict]


def flag_cost_words(r):
    """A whole step with find_unused_parameters against one without: `r` a Ratio of the time
    with the flag over the time without, per round."""
    return {"faster": "slower with the flag than without",
            "slower": "faster with the flag than without",
            "within noise": "within noise with and without the flag: this timing cannot tell "
                            "the two apart",
            "cannot tell": "not told apart with and without the flag: one round has no "
                           "spread"}[r.verdict]


def flag_step_words(r, walk_share):
    """What the whole-step timing of find_unused_parameters says beside the profiled walk: `r` a
    Ratio of the time with the flag over the time without, per round; `walk_share` the walk's
    profiled share of a step, in %. A slowdown is compared with the walk's share."""
    trust = "the profiler's count of the walk is the measure of the walk itself"
    if r.verdict == "faster":   # the time without the flag was the smaller
        extra = 100 * (r.median - 1)
        other = ("other work the flag adds (such as the `_DDPSink` node on the outputs, the scan "
                 "of the outputs for tensors and the all-reduce of the used-parameter map) or "
                 "the machine's load")
        grew = (f"The step grew by {extra:.2g} % (the median per round), "
                if extra < 10 else f"The step grew by {extra:.0f} % (the median per round), ")
        if extra >= 10 * walk_share:
            return (grew + f"about {extra / walk_share:.0f} times the walk's profiled share "
                    f"({walk_share:.2g} % of a step): far more than the walk, so most of it is "
                    f"{other}, which this timing does not tell apart; {trust}.")
        return (grew + f"less than 10 times the walk's profiled share ({walk_share:.2g} % of a "
                f"step): this timing does not tell the walk apart from {other}; {trust}.")
    if r.verdict == "slower":
        return ("The flag only adds work, so a faster step with it comes from something other "
                "than the flag, such as the machine's load between the turns (not measured "
                f"here); {trust}.")
    return (f"A cost of {walk_share:.2g} % of a step (the profile above) can hide under a busy "
            f"machine's noise; {trust} (it leaves out the flag's extra all-reduce of the "
            "used-parameter map, counted above).")
