"""Words the GPU chapter (book/gpus.ipynb) chooses by its numbers: the copies' pool and fit, the
unsynchronised timer, the two product sizes and thread counts, the roofline's roofs, and the
GPU-only sections where the GPU reference run has (or lacks) their figures. Each branch has its
words, tested in tests/test_gpus_words.py, so that no notebook cell decides prose untested."""
import math
import statistics

from .words import plural

__all__ = ["pool_words", "copy_fit_words", "unsynced_timing_words", "size_growth_words",
           "threads_ratio_words", "launch_bound_words", "one_call_words",
           "queued_words", "link_cost_words",
           "memory_pass_words", "compute_roof_words", "gpu_roofs", "reference_copies_words",
           "reference_link_words", "reference_memory_words", "reference_streams_words",
           "reference_chapter_figures", "reference_timer_words",
           "H200_DATASHEET", "LINK_SPECS", "pinned_words", "overlap_words", "fit_ends_words",
           "iqr_words"]

BAND = 0.1             # two single timings closer than this cannot be told apart
NEAR_ROOF = 0.8        # a product at this share of the compute roof or more is near it
ABOVE_ROOF = 1.05      # above this share, the peak's own run was the slower one
TINY_PRODUCT = 256     # an n x n product this small or smaller is split among threads at a loss
BUSY_LOAD = 0.5        # a load per core above this is named as a likely cause of a stray run


def one_call_words(one, many):
    """The same work as one call against as many tiny calls, each (median, fastest, slowest)
    seconds of its repeats: one call faster when its slowest repeat beat the many calls'
    fastest, slower the other way round, else this run cannot tell them apart."""
    x = many[0] / one[0]
    if one[2] < many[1]:
        return f"doing the work as one call was {x:,.0f} times as fast, in every repeat"
    if one[1] > many[2]:
        return (f"doing the work as one call was slower ({x:.2f} times as fast), in every repeat, "
                "which this run does not explain")
    return (f"the repeats of one call and of the many calls overlap ({x:.2f} times as fast at "
            "the medians), so this run cannot tell them apart")


def queued_words(queued, done):
    """The thread-as-stream rounds: seconds at which the clock read without waiting (`queued`)
    and after waiting (`done`), one each a round. Later in every round, at the medians only
    (some rounds overlap: this run cannot tell them apart round by round), or not later."""
    q, d = statistics.median(queued), statistics.median(done)
    if max(queued) < min(done):
        return f"{d / q:,.0f} times later, in every round"
    if q < d:
        return (f"{d / q:,.0f} times later at the medians, though some rounds overlap, so this "
                "run cannot tell them apart round by round")
    return "no later than the clock read without waiting, which this run does not explain"


def pool_words(pool_mib, cache_mib=None):
    """'a pool of N MiB' and how it compares with the CPU's largest cache (None: not listed):
    larger, so no copy finds its data in a cache, or smaller, so some may."""
    words = f"a pool of {pool_mib:,d} MiB"
    if cache_mib is None:
        return words + " (this system does not list its cache sizes)"
    if pool_mib > cache_mib:
        return words + f", more than this CPU's largest cache ({cache_mib:,.0f} MiB)"
    return words + (f", less than this CPU's largest cache ({cache_mib:,.0f} MiB): some copies "
                    "may still find their data there")


def copy_fit_words(falls, worst, load=None):
    """Whether alpha + b/beta describes the copies: `falls` the number of sizes whose every
    run was faster than every run of 4x fewer bytes, `worst` the model's largest miss (a
    ratio >= 1), `load` the machine's load per core (None: not known). Within 2x and never
    falling: it fits; else the run strays, and the load is named as the likely cause only
    where it was measured above BUSY_LOAD."""
    if worst < 1:
        raise ValueError(f"the largest miss is a ratio >= 1, got {worst}")
    if not falls and worst <= 2:
        return ("the time never falls as the bytes grow (the smallest copies stay flat within "
                "their spread), and one latency and one bandwidth describe every copy")
    fell = (f": the time fell at {plural(falls, 'size')} although the bytes grew"
            if falls else "")
    if load is not None and load > BUSY_LOAD:
        return (f"this run strays from it{fell}. The machine was busy (load {load:.1f} per "
                "core), a likely cause: rerun the cells on a quiet machine")
    seen = ("" if load is None else
            f" (the load was {load:.1f} per core, not high enough to blame)")
    return (f"this run strays from it{fell}, and this run does not say why{seen}: other work "
            "on the machine, or where the memory was placed, is a likely reason, not measured "
            "here; rerun the cells to see whether it recurs")


def unsynced_timing_words(wrong_s, right_s):
    """(verdict, words) for a GPU product timed without and with synchronising, in rounds (lists
    of seconds): 'too small' when every unsynchronised round read less than every synchronised
    one, 'too large' when every one read more, 'cannot tell' when the rounds overlap."""
    wrong, right = statistics.median(wrong_s), statistics.median(right_s)
    if max(wrong_s) < min(right_s):
        return "too small", (f"the unsynchronised timing was {right / wrong:.0f} times too small "
                             "in every round: it timed the queueing")
    if min(wrong_s) > max(right_s):
        return "too large", ("the unsynchronised timing was larger in every round, which this "
                             "run does not explain")
    return "cannot tell", "the rounds overlap, so this run cannot tell the two timings apart"


def size_growth_words(x, expected=64):
    """How a product 4x as large (`expected` = 64 times the arithmetic) compared in time, `x`
    its measured ratio: within a factor of 2 of the arithmetic, more, or less."""
    if expected / 2 <= x <= expected * 2:
        return f"within a factor of 2 of the {expected} that the arithmetic alone predicts"
    return (f"{'more' if x > expected * 2 else 'less'} than the {expected} that the arithmetic "
            "alone predicts, and this run does not say why (the two sizes were timed at "
            "different moments, on a machine other work may keep busy)")


def threads_ratio_words(r, threads, n):
    """The verdict on an n x n product timed on one thread and on `threads` in turns (`r`
    helpers.ratio(one thread, all threads): how many times as fast all threads were, round by
    round): faster, slower, or within noise (this run cannot tell), from the rounds' spread."""
    what = f"the {n}x{n} product"
    if threads == 1:
        return (f"PyTorch had one thread here, so {what} was timed on one thread only: this run "
                "compares no thread counts.")
    spread = f"{r.median:.2f} times as fast, {r.lo:.2f} to {r.hi:.2f} over the rounds"
    if r.verdict == "faster":
        return f"Timed in turns, {what} on {threads} threads was faster than on one ({spread})."
    if r.verdict == "slower":
        why = ("threading overhead is a likely reason, not measured here" if n <= TINY_PRODUCT
               else "this run does not say why; other work on the cores is one possible cause")
        return (f"Timed in turns, {what} on {threads} threads was slower than on one ({spread}): "
                f"{why}.")
    return (f"Timed in turns, {what} on {threads} threads and on one are within noise of each "
            f"other ({spread}): this run cannot tell them apart.")


def launch_bound_words(call_s, peak_flops, rounds=1, product_s=None):
    """What bounds a small float32 product on the GPU beyond its intensity, after "from n ≈ N":
    `call_s` a 1 KiB copy's call in the GPU reference run (the median of `rounds` rounds; 1: one
    reading; None: not measured, a prediction), `product_s` a tiny product's call there where the
    run timed one (ten back to back), `peak_flops` the GPU's compute roof. Until 2n³/P reaches
    the call's cost, the call, not either roof, sets the time: a prediction from those readings."""
    if not (product_s or call_s):
        return (", by its intensity alone. A call's fixed cost, microseconds on a GPU (a "
                "prediction: no GPU run has measured it), outlasts the arithmetic of far larger "
                "products")
    if (product_s or call_s) <= 0 or peak_flops <= 0:
        raise ValueError(f"a time and a rate must be > 0, got {call_s} s and {peak_flops}")
    how = "one reading" if rounds == 1 else f"the median of {rounds} rounds"
    said = (f"A tiny product's call ({product_s * 1e6:.1f} µs in the GPU reference run: ten "
            f"back to back, {how})" if product_s else
            f"A call's fixed cost ({call_s * 1e6:.1f} µs in the GPU reference run: {how} of a "
            "1 KiB copy's call; a product's launch was not timed)")
    n = ((product_s or call_s) * peak_flops / 2) ** (1 / 3)
    return (f", by its intensity alone. {said} outlasts the arithmetic until 2n³/P reaches it, "
            f"at n ≈ {n:,.0f} (a prediction from that reading): smaller products would be bound "
            "by the call, not by either roof")


def memory_pass_words(copy_bw, mem_bw):
    """Which pass over memory set the memory roof (the faster of the two): the copy or the
    addition."""
    return "a copy" if copy_bw >= mem_bw else "the addition"


def iqr_words(iqr, median):
    """What `blocked_autorange`'s IQR (the spread of the middle half of its blocks) says beside
    its median: wide (half the median or more: the blocks' times varied that much, so only the
    medians are compared) or narrow."""
    if not median > 0:
        raise ValueError(f"a median must be > 0, got {median}")
    if iqr >= 0.5 * median:
        return (f"its IQR, {iqr * 1e3:.2f} ms, is {iqr / median:.0%} of the median: the middle "
                "half of its blocks spread that widely, so only the medians are compared here")
    return (f"its IQR, {iqr * 1e3:.2f} ms, is {iqr / median:.0%} of the median: the middle half "
            "of its blocks stayed close to it")


def compute_roof_words(share):
    """Where the largest product sits against the compute roof, `share` its median FLOP/s over
    the roof P, measured apart from it (the fastest reading of a separate run of the same
    product): near it, below it, or above it (then the roof's own run was the slower one)."""
    if not share > 0:
        raise ValueError(f"a share of the peak must be > 0, got {share}")
    if share > ABOVE_ROOF:
        return (f"above the compute roof ({share:.0%} of $P$): the table's run of this "
                "product beat the fastest reading of the separate run, so that run was slowed "
                "and this $P$ is too low")
    if share >= NEAR_ROOF:
        return (f"near the compute roof ({share:.0%} of $P$, the fastest reading of a separate "
                "run)")
    return (f"below the compute roof ({share:.0%} of $P$): its median fell short of the "
            "fastest reading of the same product in the separate run, which this run does not "
            "explain (other work on the machine is one possible cause)")


# NVIDIA's H200 datasheet: float32 and dense bfloat16 FLOP/s, memory bytes/s
H200_DATASHEET = dict(peak=67e12, bf16=989e12, bw=4.8e12)
# PCI-SIG's PCIe 4.0 and 5.0 specifications (per lane, 128b/130b encoding); NVLink 4 on H100
# and H200 SXM: 18 links of 25 GB/s each way in all (NVIDIA's Hopper architecture whitepaper)
LINK_SPECS = dict(pcie4_gt_s=16e9, pcie5_gt_s=32e9, pcie4_lanes=16, pcie4_encoding=128 / 130,
                  nvlink4_links=18, nvlink4_link_gbs=25)


def _against(what, got, lo, hi, show, source):
    """One fitted value against the range its copy's readings give: below, above, or within."""
    span = f"the range {source} ({show(lo)} to {show(hi) if math.isfinite(hi) else 'no limit'})"
    if got < lo:
        return f"the fit's {what}, {show(got)}, is below {span}"
    if got > hi:
        return f"the fit's {what}, {show(got)}, is above {span}"
    return (f"the fit's {what}, {show(got)}, is within {span}, so this run cannot tell it from "
            f"the chapter's")


def fit_ends_words(alpha_s, beta_gbs, smallest, largest):
    """Exercise 4's least-squares fit (`alpha_s` seconds, `beta_gbs` GB/s) against the model
    through the two ends: `smallest` and `largest` are (bytes, (median, fastest, slowest)
    seconds) of the copies that fix alpha (the smallest's median) and beta (the largest's, less
    alpha). Each fitted value is below, above, or within what those copies' readings give."""
    (_, (a_med, a_lo, a_hi)), (nbytes, (_, b_lo, b_hi)) = smallest, largest
    if not a_lo <= a_med <= a_hi or not b_lo <= b_hi:
        raise ValueError("each copy's readings must be (median, fastest, slowest)")
    # beta from the slowest and the fastest reading (none above alpha: no limit that way)
    low = nbytes / (b_hi - a_med) / 1e9 if b_hi > a_med else 0.0
    high = nbytes / (b_lo - a_med) / 1e9 if b_lo > a_med else math.inf
    said = [_against("α", alpha_s, a_lo, a_hi, lambda s: f"{s * 1e6:.2f} µs",
                     "of the smallest copy's readings"),
            _against("β", beta_gbs, low, high, lambda g: f"{g:.1f} GB/s",
                     "the largest copy's readings give")]
    return said[0][0].upper() + said[0][1:] + "; " + said[1] + "."


def gpu_roofs(ref):
    """(peak FLOP/s, memory bytes/s, where they come from) of the GPU's roofline: the GPU
    reference run's float32 product and largest on-GPU copy (`ref` helpers.gpu_reference()),
    or, where it lacks them, NVIDIA's H200 datasheet, called a prediction."""
    comm = ref.get("paths", {}).get("comm", {})
    if comm.get("matmul_fp32_flops_per_s") and comm.get("copy_s"):
        big = max(comm["copy_s"], key=int)
        bw = 2 * int(big) / comm["copy_s"][big]          # read + written
        return (comm["matmul_fp32_flops_per_s"], bw,
                f"measured by the GPU reference run, {ref['date']}, on its {ref['gpu']}: a "
                f"4096x4096 float32 product without TF32, and a copy of "
                f"{int(big) // 2**20} MiB inside its memory")
    sheet = H200_DATASHEET
    return (sheet["peak"], sheet["bw"],
            f"a prediction from NVIDIA's H200 datasheet ({sheet['peak'] / 1e12:.0f} TFLOP/s "
            f"float32, {sheet['bw'] / 1e12:.1f} TB/s): no GPU reference run records them yet")


def pinned_words(pinned_gbs, pageable_gbs):
    """The verdict on a host-to-GPU copy from pinned against pageable memory (one timing each,
    no spread): pinned faster, slower, or within BAND of each other (cannot tell)."""
    x = pinned_gbs / pageable_gbs
    if x > 1 + BAND:
        return f" Pinned memory was {x:.1f} times as fast."
    if x < 1 / (1 + BAND):
        return (f" Pinned memory was slower here ({x:.2f} times the pageable rate), which this "
                "run does not explain.")
    return (f" The two rates are within {BAND:.0%} of each other: from one timing each, this run "
            "cannot tell them apart.")


def link_cost_words(inside_gbs=None, pinned_gbs=None, pageable_gbs=None):
    """A sentence on a copy over the link against one inside the GPU's memory (GB/s, each byte
    counted once; one timing each): the link costlier per byte, cheaper, or within BAND (cannot
    tell). None: no run measured them, the sentence is a prediction."""
    if inside_gbs is None:
        return ("A copy over the link is expected to cost far more per byte than one inside the "
                "GPU's memory (a prediction)")
    x = inside_gbs / max(pinned_gbs, pageable_gbs)
    if x > 1 + BAND:
        return (f"A copy over the link cost {x:,.0f} times as much per byte as one inside the "
                "GPU's memory, from the faster of the two host memories")
    if x < 1 / (1 + BAND):
        return ("A copy over the link cost less per byte than one inside the GPU's memory here, "
                "which this run does not explain")
    return (f"A copy over the link and one inside the GPU's memory are within {BAND:.0%} of each "
            "other: from one timing each, this run cannot tell them apart")


def overlap_words(one_s, two_s):
    """The verdict on a copy and a product on one stream against the copy on a second stream
    (a median each, no spread): the second stream faster (they overlapped), slower, or within
    BAND of each other (cannot tell)."""
    if two_s < one_s / (1 + BAND):
        return (f" The second stream made the pair {one_s / two_s:.1f} times as fast: the copy "
                "ran while the product did.")
    if two_s > one_s * (1 + BAND):
        return (" The second stream was slower, which this run does not explain: the copy "
                "did not hide behind the product.")
    return (f" The two are within {BAND:.0%} of each other: this run cannot tell whether the copy "
            "overlapped the product.")


def _where(ref):
    return f"In the GPU reference run ({ref['gpu']}, {ref['date']})"


def _not_yet(ref, what, then):
    """' No GPU run has recorded <what> yet (...): <then>.' for a section the run lacks."""
    ran = (" (the GPU reference run executed this chapter's code, but it stores only whether "
           "each cell ran through, not the figures the cells print)" if ref.get("exists") else "")
    return f" No GPU run has recorded {what} yet{ran}: {then}."


def reference_chapter_figures(ref):
    """The GPU-only sections' figures the reference run's gpus step recorded on a GPU
    (helpers.devices.gpu_chapter_figures, scripts/gpu_runner.sh), or None."""
    fig = ref.get("paths", {}).get("gpus") if ref else None
    return fig if fig and "pinned_gbs" in fig else None   # a dry run's CPU has none


def reference_timer_words(ref, work, noted=False):
    """After "this machine has no GPU": the reference run's `work`-sized products (n, reps,
    rounds) timed without and with synchronising, as the chapter's cell times them, and the
    verdict; where no run recorded them, that the section's GPU reading is a prediction ("" when
    the note on the run's failed cell, `noted`, says so already)."""
    fig = reference_chapter_figures(ref)
    if fig and fig.get("timer") == dict(work):
        n, right = work["n"], statistics.median(fig["right_s"])
        _, seen = unsynced_timing_words(fig["wrong_s"], fig["right_s"])
        return (f" {_where(ref)}, with {n}x{n} products in {work['rounds']} rounds, {seen}; "
                f"synchronised, a product took {right * 1e3:.2f} ms "
                f"({2 * n**3 / right / 1e12:.1f} TFLOP/s).")
    if noted:
        return ""
    return _not_yet(ref, "these two timings", "that a reading without synchronising is too "
                    "small is a prediction")


def reference_copies_words(ref):
    """After "this machine has no GPU": the reference run's host-to-GPU copies (pinned,
    pageable) and the copy inside the GPU (GB/s of bytes copied, each counted once, like the
    link's), or that none was recorded (then pinned's speed is a prediction)."""
    fig = reference_chapter_figures(ref)
    if not fig:
        return _not_yet(ref, "these copies", "pinned memory is expected to be the faster "
                        "(a prediction)")
    return (f" {_where(ref)}, {fig['mib']} MiB moved at {fig['pinned_gbs']:.1f} GB/s from "
            f"pinned memory and {fig['pageable_gbs']:.1f} GB/s from pageable memory (CUDA "
            f"events), while a copy inside the GPU's memory ran at {fig['inside_gbs']:.0f} GB/s "
            "(each byte counted once, as over the link)."
            + pinned_words(fig["pinned_gbs"], fig["pageable_gbs"]))


def reference_link_words(ref):
    """After "nothing to time with events": the reference run's copy between two GPUs, that it
    had one GPU, or "" where no run recorded the GPU chapter's figures (no number is quoted)."""
    fig = reference_chapter_figures(ref)
    if not fig:
        return ""
    if "gpu_to_gpu_gbs" not in fig:
        return " The GPU reference run had one GPU: no copy between GPUs has been timed yet."
    how = "P2P" if fig["p2p"] else "via the host"
    return (f" {_where(ref)}, a copy of {fig['mib']} MiB from cuda:0 to cuda:1 ({how}) ran at "
            f"{fig['gpu_to_gpu_gbs']:.1f} GB/s.")


def reference_memory_words(ref):
    """After "no such counters for the CPU": LeNet's step memory in the reference run, or ""
    where no run recorded it (no number is quoted)."""
    fig = reference_chapter_figures(ref)
    if not fig:
        return ""
    return (f" {_where(ref)}, one forward and backward of LeNet on 256 images peaked at "
            f"{fig['step_peak_mib']:.1f} MiB above the {fig['before_mib']:.1f} MiB allocated "
            "before it.")


def reference_streams_words(ref):
    """After "the thread above is the nearest thing to a stream": the reference run's copy and
    product on one stream and on two, or that no run recorded them (a prediction)."""
    fig = reference_chapter_figures(ref)
    if not fig:
        return _not_yet(ref, "the two streams' times", "the overlap described above is a "
                        "prediction")
    return (f" {_where(ref)}, a copy of {fig['mib']} MiB and a 4096x4096 product took "
            f"{fig['one_stream_ms']:.2f} ms on one stream and {fig['two_streams_ms']:.2f} ms "
            "with the copy on a second stream." + overlap_words(fig["one_stream_ms"],
                                                                fig["two_streams_ms"]))
