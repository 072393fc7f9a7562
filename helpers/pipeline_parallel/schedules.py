"""Pipeline schedules: the order of forward (F) and backward (B) passes on each stage, the clock
they run to, their bubble and what they keep alive; drawn as one row per device.

One convention for every Part: p stages, m micro-batches, always in that order (p, m[, rank]);
an order is a list of ("F" or "B", micro-batch). gpipe_order(p, m) / one_f_one_b_order(p, m)
give every stage's (Part I runs them on simulated devices, pipeline_parallel.simulated);
gpipe_rank_order(p, m, rank) / one_f_one_b_rank_order(p, m, rank) give one rank's (Part VI,
across processes, pipeline_parallel.scratch): the same orders, row `rank` (one implementation
each: gpipe_rank_order is gpipe_order's row, one_f_one_b_order stacks one_f_one_b_rank_order's;
tests/test_pipeline_splits.py checks both). GPipe runs the backwards in the order of the
forwards, first micro-batch first, as torch.distributed.pipelining's ScheduleGPipe does
(reversed would be a valid GPipe too: the ticks, the bubble and the peak of live micro-batches
are the same).
"""
from ..runtime.emulate import model_time
from ..validate import validate_positive_int

__all__ = ["needs", "chunk_needs", "gpipe_order", "one_f_one_b_order", "validate_orders",
           "clock_ticks", "run_boxes", "bubble_fraction",
           "schedule_bubble", "replay", "measured_bubble", "peak_live", "plot_schedule",
           "plot_live", "gpipe_rank_order", "one_f_one_b_rank_order", "busy_times",
           "timeline_bubble", "as_schedule", "unequal_bubble", "interleaved_order",
           "interleaved_ticks", "interleaved_bubble", "stage_times",
           "with_durations"]


def gpipe_order(p, m):
    """GPipe's order: every stage runs the forwards of all m micro-batches, then their
    backwards, first micro-batch first. One list of ("F" or "B", micro-batch) per stage."""
    return [[("F", j) for j in range(m)]
            + [("B", j) for j in range(m)] for _ in range(p)]


def one_f_one_b_order(p, m):
    """1F1B (PipeDream-Flush): stage s runs p-1-s forwards to fill the pipeline, then one
    forward and one backward in turn, then the remaining backwards. Same format as gpipe_order."""
    return [one_f_one_b_rank_order(p, m, s) for s in range(p)]


def needs(q, phase, j, stages):
    """The box that stage q's (phase, j) waits for, as (stage, phase, j), or None: a forward
    needs stage q-1's forward of j, a backward stage q+1's backward of j (the last stage: its
    own forward), a weight-gradient box W its own backward of j. q counts virtual stages: with v
    chunks per device, chunk c of device d is stage c*p + d of stages = v*p (plain: v = 1)."""
    if phase == "F":
        return (q - 1, "F", j) if q > 0 else None
    if phase == "B":
        return (q + 1, "B", j) if q < stages - 1 else (q, "F", j)
    return (q, "B", j)


def chunk_needs(d, phase, j, c, p, v):
    """needs() for device d's op on chunk c (p devices, v chunks each), as (device, phase, j,
    chunk), or None."""
    before = needs(c * p + d, phase, j, v * p)
    return None if before is None else (before[0] % p, before[1], j, before[0] // p)


def validate_orders(orders):
    """The number of micro-batches of per-stage orders, or ValueError naming what is wrong:
    every stage must run the forward and the backward of every micro-batch exactly once."""
    if not isinstance(orders, (list, tuple)) or not orders:
        raise ValueError("expected one list of (phase, micro-batch) per stage")
    m = sum(1 for op in orders[0] if tuple(op)[0] == "F")
    want = sorted([("B", j) for j in range(m)] + [("F", j) for j in range(m)])
    for s, ops in enumerate(orders):
        got = sorted(tuple(op) for op in ops)
        if got != want:
            raise ValueError(f"stage {s} runs {got}; every stage must run ('F', j) and ('B', j) "
                             f"once for each micro-batch j in range({m})")
    return m


def clock_ticks(orders):
    """{(stage, phase, micro): tick}: each stage runs its order one op per clock tick, as soon as
    the op it needs (needs) ran in an earlier tick: interleaved_ticks with one chunk per stage.
    ValueError if some stage would wait forever."""
    ticks = interleaved_ticks([[(*op, 0) for op in ops] for ops in orders], 1)
    return {(s, phase, j): tick for (s, phase, j, _), tick in ticks.items()}


def run_boxes(rows, finish, v=1):
    """Run per-device rows of boxes (dicts with stage, phase, micro and, for v chunks per
    device, chunk) on runtime.emulate.model_time: each box starts when its device is free and
    the box it needs (chunk_needs) has ended; finish(box, start) is when it ends. Returns copies
    with start and end, one list per device. ValueError if some box would wait forever."""
    p = len(rows)

    def key(b):
        return b["stage"], b["phase"], b["micro"], b.get("chunk", 0)
    return model_time(rows, key, lambda b: chunk_needs(*key(b), p, v), finish=finish)


def bubble_fraction(p, m):
    """Share of idle device time in a GPipe step with p EQUAL stages and m micro-batches."""
    validate_positive_int(p, "p")
    validate_positive_int(m, "m")
    return (p - 1) / (m + p - 1)


def unequal_bubble(forward, backward, m):
    """Idle share of a GPipe step on stages of UNEQUAL speed: stage s takes forward[s] and
    backward[s] seconds per micro-batch, m micro-batches, each stage on its own device.

    The forwards flow through the stages like jobs through a production line: the last one
    leaves after sum(forward) + (m-1) * max(forward); the backwards likewise. So the step lasts
    span = sum(forward + backward) + (m-1) * (max(forward) + max(backward)), and the bubble is
    1 - m * sum(forward + backward) / (p * span). With equal stages it is (p-1)/(m+p-1)."""
    p = len(forward)
    if p == 0 or len(backward) != p:
        raise ValueError(f"need one forward and one backward time per stage, got {len(forward)} "
                         f"and {len(backward)}")
    if m < 1:
        raise ValueError(f"need at least one micro-batch, got m={m}")
    work = sum(forward) + sum(backward)
    span = work + (m - 1) * (max(forward) + max(backward))
    return 1 - m * work / (p * span)


def schedule_bubble(schedule):
    """Idle share counted from a recorded schedule: empty (stage, tick) slots over all slots.
    It counts the slots the schedule built, so it assumes every op takes one tick."""
    p = 1 + max(e["stage"] for e in schedule)
    ticks = 1 + max(e["tick"] for e in schedule)
    return 1 - len({(e["stage"], e["tick"]) for e in schedule}) / (p * ticks)


def replay(schedule):
    """The schedule as it would run with every stage on its own device, all in parallel: each op
    takes its measured time (end - start) and starts when its stage is free and the op it needs
    has finished (run_boxes). Returns a copy with start and end replaced."""
    ops = sorted(schedule, key=lambda e: (e["tick"], e["stage"]))
    rows = [[] for _ in range(1 + max(e["stage"] for e in schedule))]
    for e in ops:
        rows[e["stage"]].append(e)
    ran = [iter(row) for row in run_boxes(rows, lambda e, t: t + e["end"] - e["start"])]
    return [next(ran[e["stage"]]) for e in ops]


def measured_bubble(schedule):
    """Time-weighted idle share from the measured busy time of every op: 1 - busy / (p * span)
    of the replayed schedule (see replay). Unequal stages make it larger than (p-1)/(m+p-1)."""
    p = 1 + max(e["stage"] for e in schedule)
    ran = replay(schedule)
    busy = sum(e["end"] - e["start"] for e in ran)
    return 1 - busy / (p * max(e["end"] for e in ran))


def stage_times(schedule):
    """Per stage, the mean busy seconds of one forward and of one backward (end - start of the
    recorded ops): the inputs of unequal_bubble. Returns (forward, backward), one list each."""
    p = 1 + max(e["stage"] for e in schedule)
    mean = lambda s, ph: (lambda t: sum(t) / len(t))(
        [e["end"] - e["start"] for e in schedule if e["stage"] == s and e["phase"] == ph])
    return [mean(s, "F") for s in range(p)], [mean(s, "B") for s in range(p)]


def with_durations(schedule, forward, backward):
    """The schedule replayed (see replay) with modelled durations instead of measured ones: every
    forward of stage s takes forward[s] seconds, every backward backward[s]. The order and the
    dependencies are the recorded ones; the durations no longer depend on how busy the machine
    was while it ran."""
    boxes = [dict(e, start=0.0, end=(forward if e["phase"] == "F" else backward)[e["stage"]])
             for e in schedule]
    return replay(boxes)


def peak_live(schedule):
    """Per stage, the most micro-batches whose activations it held at once, counted from the run."""
    p = 1 + max(e["stage"] for e in schedule)
    return [max(e["live"] for e in schedule if e["stage"] == s) for s in range(p)]



def plot_schedule(schedule, ax=None, title=None, clock="tick"):
    """Draw a recorded schedule: one row per device, one box per forward (F), backward (B) or
    weight-gradient box (W, zero bubble); clock="tick" places boxes by schedule slot,
    clock="time" by the measured seconds. The ops of an interleaved schedule's odd chunks
    (e["chunk"]) are drawn lighter."""
    import matplotlib.pyplot as plt
    p = 1 + max(e["stage"] for e in schedule)
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 1 + 0.5 * p))
    span = lambda e: (e["tick"], 1) if clock == "tick" else (e["start"], e["end"] - e["start"])
    end = max(sum(span(e)) for e in schedule)
    ax.barh(range(p), [end] * p, height=0.8, color="0.93", hatch="//", edgecolor="0.8")
    colors = {"F": ("tab:blue", "#9ecae1"), "B": ("tab:orange", "#fdae6b"),
              "W": ("tab:green", "#a1d99b")}   # chunk 0, 1
    for e in schedule:
        left, width = span(e)
        ax.barh(e["stage"], width, left=left, height=0.8, edgecolor="white",
                color=colors[e["phase"]][e.get("chunk", 0) % 2])
        if clock == "tick":
            ax.text(left + 0.5, e["stage"], f"{e['phase']}{e['micro']}", ha="center",
                    va="center", color="white", fontsize=8)
    ax.set(yticks=range(p), yticklabels=[f"device {s}" for s in range(p)], xlim=(0, end),
           xlabel="clock tick" if clock == "tick" else "seconds since the step began",
           title=title or f"bubble {schedule_bubble(schedule):.0%}")
    ax.invert_yaxis()
    from matplotlib.patches import Patch
    handles = [Patch(color="tab:blue", label="forward"), Patch(color="tab:orange", label=(
        "backward (input gradient)" if any(e["phase"] == "W" for e in schedule) else "backward"))]
    if any(e["phase"] == "W" for e in schedule):
        handles.append(Patch(color="tab:green", label="weight gradient"))
    ax.legend(handles=handles + [Patch(facecolor="0.93", hatch="//", edgecolor="0.8",
                                       label="idle")],
              loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
    return ax


def plot_live(schedule, ax=None, title=None):
    """Per stage, the micro-batches whose activations it holds, tick by tick (a step plot)."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 2.5))
    p = 1 + max(e["stage"] for e in schedule)
    ticks = 1 + max(e["tick"] for e in schedule)
    for s in range(p):
        live, now = [], 0
        at = {e["tick"]: e["live"] for e in schedule if e["stage"] == s}
        for t in range(ticks):
            now = at.get(t, now)
            live.append(now)
        ax.step(range(ticks), live, where="post", label=f"device {s}")
    ax.set(xlabel="clock tick", ylabel="live micro-batches", title=title, xlim=(0, ticks))
    ax.legend(fontsize=8, frameon=False)
    return ax


# ---- a rank's own order, and its measured timeline (Part VI) -------------------------------
def gpipe_rank_order(p, m, rank):
    """GPipe: Part I's gpipe_order, this rank's row (every forward, then every backward: m
    micro-batches live at the peak)."""
    return gpipe_order(p, m)[rank]


def one_f_one_b_rank_order(p, m, rank):
    """1F1B: p - rank - 1 forwards to fill the pipe, then one forward and one backward in turn,
    then the remaining backwards. At most p - rank micro-batches are live on this rank."""
    warm = min(p - rank - 1, m)
    order = [("F", j) for j in range(warm)]
    for i in range(m - warm):
        order += [("F", warm + i), ("B", i)]
    return order + [("B", j) for j in range(m - warm, m)]


def busy_times(timelines):
    """Seconds each rank spent computing (its F and B boxes), from the per-rank timelines."""
    return [sum(e["end"] - e["start"] for e in tl) for tl in timelines]


def timeline_bubble(timelines):
    """Idle share of the step: 1 - busy time / (ranks x span from the first start to the last
    end). All ranks read time.perf_counter, one clock for every process on a machine."""
    events = [e for tl in timelines for e in tl]
    span = max(e["end"] for e in events) - min(e["start"] for e in events)
    return 1 - sum(busy_times(timelines)) / (len(timelines) * span)


def as_schedule(timelines):
    """The per-rank timelines as one list for helpers.plot_schedule(clock="time"): seconds since
    the first box started on any rank."""
    t0 = min(e["start"] for tl in timelines for e in tl)
    return [dict(e, start=e["start"] - t0, end=e["end"] - t0, tick=0)
            for tl in timelines for e in tl]




# ---- interleaved 1F1B: v model chunks per device (Narayanan et al. 2021) --------------------
def interleaved_order(p, m, v=2):
    """Interleaved 1F1B (Megatron-LM): device d holds v chunks of the model, chunk c being
    virtual stage c*p + d. Micro-batches go through the chunks in groups of p; device d warms up
    with 2(p-1-d) + (v-1)p forwards, then runs one forward and one backward in turn, then the
    remaining backwards. One list of (phase, micro-batch, chunk) per device. m must be a
    multiple of p (the groups)."""
    if p < 1 or v < 1 or m < 1 or m % p:
        raise ValueError(f"interleaving needs p, v >= 1 and m a multiple of p; got p={p}, m={m}, "
                         f"v={v} (use m = {max(1, -(-m // p)) * p})")
    total = m * v

    def forward(k):        # the k-th forward a device runs: (micro-batch, chunk)
        return (k // (p * v)) * p + k % p, (k // p) % v

    def backward(k):
        return (k // (p * v)) * p + k % p, v - 1 - (k // p) % v

    orders = []
    for d in range(p):
        warm = total if m == p else min(total, 2 * (p - 1 - d) + (v - 1) * p)
        ops = [("F", *forward(k)) for k in range(warm)]
        for i in range(total - warm):
            ops += [("F", *forward(warm + i)), ("B", *backward(i))]
        orders.append(ops + [("B", *backward(k)) for k in range(total - warm, total)])
    return orders


def interleaved_ticks(orders, v):
    """{(device, phase, micro, chunk): tick} for per-device orders of (phase, micro, chunk):
    each device runs one chunk's op per tick (a tick is 1/v of a whole stage's op), as soon as
    the op it needs (chunk_needs) ran in an earlier tick: run_boxes with every op one tick
    long, in the order of the ticks."""
    rows = [[dict(stage=d, phase=phase, micro=j, chunk=c) for phase, j, c in ops]
            for d, ops in enumerate(orders)]
    ran = [b for row in run_boxes(rows, lambda b, t: t + 1, v) for b in row]
    return {(b["stage"], b["phase"], b["micro"], b["chunk"]): int(b["start"])
            for b in sorted(ran, key=lambda b: (b["start"], b["stage"]))}


def interleaved_bubble(p, m, v):
    """Idle share of interleaved 1F1B on p equal devices, v chunks each, m micro-batches: the
    fill and drain shrink to (p-1) chunk-ops of 1/v of a stage, so (p-1) / (v*m + p-1)."""
    for value, name in ((p, "p"), (m, "m"), (v, "v")):
        validate_positive_int(value, name)
    return (p - 1) / (v * m + p - 1)
