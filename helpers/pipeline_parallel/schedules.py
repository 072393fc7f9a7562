"""Pipeline schedules: the order of forward (F) and backward (B) passes on each stage, the clock
they run to, their bubble and what they keep alive; drawn as one row per device.

Part I runs them on simulated devices (pipeline_parallel.simulated), Part VI across processes
(pipeline_parallel.scratch). An order is a list of ("F" or "B", micro-batch) per stage.
"""
__all__ = ["gpipe_order", "one_f_one_b_order", "check_orders", "clock_ticks", "bubble_fraction",
           "schedule_bubble", "replay", "measured_bubble", "peak_live", "plot_schedule",
           "plot_live", "gpipe_rank_order", "one_f_one_b_rank_order", "busy_times",
           "timeline_bubble", "as_schedule"]


def gpipe_order(p, m):
    """GPipe's order: every stage runs the forwards of all m micro-batches, then their
    backwards, last micro-batch first. One list of ("F" or "B", micro-batch) per stage."""
    return [[("F", j) for j in range(m)] + [("B", j) for j in reversed(range(m))]
            for _ in range(p)]


def one_f_one_b_order(p, m):
    """1F1B (PipeDream-Flush): stage s runs p-1-s forwards to fill the pipeline, then one
    forward and one backward in turn, then the remaining backwards. Same format as gpipe_order."""
    orders = []
    for s in range(p):
        warm = min(p - 1 - s, m)
        ops = [("F", j) for j in range(warm)]
        for j in range(m - warm):
            ops += [("F", warm + j), ("B", j)]
        orders.append(ops + [("B", j) for j in range(m - warm, m)])
    return orders


def _needs(s, phase, j, p):
    """The op that must have run before (s, phase, j): the previous stage's forward of the same
    micro-batch, the next stage's backward (the last stage: its own forward); None for the first."""
    if phase == "F":
        return (s - 1, "F", j) if s > 0 else None
    return (s + 1, "B", j) if s < p - 1 else (s, "F", j)


def check_orders(orders):
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
    the op it needs (_needs) ran in an earlier tick. ValueError if some stage would wait forever."""
    p, total = len(orders), sum(len(ops) for ops in orders)
    done, pos, tick = {}, [0] * p, 0
    while len(done) < total:
        ready = []
        for s in range(p):
            if pos[s] < len(orders[s]):
                phase, j = orders[s][pos[s]]
                need = _needs(s, phase, j, p)
                if need is None or done.get(need, tick) < tick:
                    ready.append((s, phase, j))
        if not ready:
            s = min(s for s in range(p) if pos[s] < len(orders[s]))
            phase, j = orders[s][pos[s]]
            raise ValueError(f"deadlock at tick {tick}: stage {s} waits forever for "
                             f"{_needs(s, phase, j, p)} before its {(phase, j)}")
        for s, phase, j in ready:
            done[(s, phase, j)] = tick
            pos[s] += 1
        tick += 1
    return done


def bubble_fraction(p, m):
    """Share of idle device time in a GPipe step with p EQUAL stages and m micro-batches."""
    return (p - 1) / (m + p - 1)


def schedule_bubble(schedule):
    """Idle share counted from a recorded schedule: empty (stage, tick) slots over all slots.
    It counts the slots the schedule built, so it assumes every op takes one tick."""
    p = 1 + max(e["stage"] for e in schedule)
    ticks = 1 + max(e["tick"] for e in schedule)
    return 1 - len({(e["stage"], e["tick"]) for e in schedule}) / (p * ticks)


def replay(schedule):
    """The schedule as it would run with every stage on its own device, all in parallel: each op
    takes its measured time (end - start) and starts when its stage is free and the op it needs
    has finished. Returns a copy with start and end replaced."""
    p = 1 + max(e["stage"] for e in schedule)
    free, finish, out = [0.0] * p, {}, []
    for e in sorted(schedule, key=lambda e: (e["tick"], e["stage"])):
        s = e["stage"]
        start = max(free[s], finish.get(_needs(s, e["phase"], e["micro"], p), 0.0))
        end = start + e["end"] - e["start"]
        finish[(s, e["phase"], e["micro"])] = free[s] = end
        out.append(dict(e, start=start, end=end))
    return out


def measured_bubble(schedule):
    """Time-weighted idle share from the measured busy time of every op: 1 - busy / (p * span)
    of the replayed schedule (see replay). Unequal stages make it larger than (p-1)/(m+p-1)."""
    p = 1 + max(e["stage"] for e in schedule)
    ran = replay(schedule)
    busy = sum(e["end"] - e["start"] for e in ran)
    return 1 - busy / (p * max(e["end"] for e in ran))


def peak_live(schedule):
    """Per stage, the most micro-batches whose activations it held at once, counted from the run."""
    p = 1 + max(e["stage"] for e in schedule)
    return [max(e["live"] for e in schedule if e["stage"] == s) for s in range(p)]


def plot_schedule(schedule, ax=None, title=None, clock="tick"):
    """Draw a recorded schedule: one row per device, one box per forward (F) or backward (B);
    clock="tick" places boxes by schedule slot, clock="time" by the measured seconds."""
    import matplotlib.pyplot as plt
    p = 1 + max(e["stage"] for e in schedule)
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 1 + 0.5 * p))
    span = lambda e: (e["tick"], 1) if clock == "tick" else (e["start"], e["end"] - e["start"])
    end = max(sum(span(e)) for e in schedule)
    ax.barh(range(p), [end] * p, height=0.8, color="0.93", hatch="//", edgecolor="0.8")
    for e in schedule:
        left, width = span(e)
        ax.barh(e["stage"], width, left=left, height=0.8, edgecolor="white",
                color="tab:blue" if e["phase"] == "F" else "tab:orange")
        if clock == "tick":
            ax.text(left + 0.5, e["stage"], f"{e['phase']}{e['micro']}", ha="center",
                    va="center", color="white", fontsize=8)
    ax.set(yticks=range(p), yticklabels=[f"device {s}" for s in range(p)], xlim=(0, end),
           xlabel="clock tick" if clock == "tick" else "seconds since the step began",
           title=title or f"bubble {schedule_bubble(schedule):.0%}")
    ax.invert_yaxis()
    from matplotlib.patches import Patch
    ax.legend(handles=[Patch(color="tab:blue", label="forward"),
                       Patch(color="tab:orange", label="backward"),
                       Patch(facecolor="0.93", hatch="//", edgecolor="0.8", label="idle")],
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
def gpipe_rank_order(m, p, rank):
    """GPipe: every forward, then every backward: m micro-batches live at the peak."""
    return [("F", j) for j in range(m)] + [("B", j) for j in range(m)]


def one_f_one_b_rank_order(m, p, rank):
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


