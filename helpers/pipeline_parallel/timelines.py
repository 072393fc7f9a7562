"""Part VI: what a pipeline's measured timelines say, and the orders and formulas beside them.

A timeline is one list per rank of boxes, dicts with phase ("F", "B" or "W"), micro, start,
end (seconds, one clock for all ranks) and, for a box whose output went to another rank, sent.
`replay_orders` runs per-rank orders with given box durations and free messages: the schedule
alone.
Set beside a measured run, it separates what the schedule costs (its bubble) from what the
machine adds (`wait_parts`: the time from a message's sending to the box that needed it).
"""
from ..runtime.emulate import model_time, waits
from ..validate import validate_positive_int
from .schedules import needs, one_f_one_b_rank_order, run_boxes, timeline_bubble

__all__ = ["pipeline_model_time", "replay_orders", "replayed_bubble", "with_ready",
           "wait_parts", "zero_bubble_rank_order", "zero_bubble_bubble",
           "bubble_added"]


def pipeline_model_time(timelines, num_stages, row_bytes, rates):
    """An emulated run's boxes on the model's clock (runtime.emulate.model_time): stage v's
    forward of j after stage v-1's, its backward (B, or the input-gradient half of a split one)
    after stage v+1's, W after its own B; a message between ranks of `rows` x `row_bytes`
    bytes takes rates.message(...). `virtual` is the stage a box ran (looped placement)."""
    def key(b):
        return (b["virtual"], b["phase"], b["micro"])
    return model_time(timelines, key, lambda b: needs(*key(b), num_stages),
                      lambda b: rates.message(b["rows"] * row_bytes))


def replay_orders(orders, seconds):
    """Run `orders` (orders[r]: rank r's list of (phase, j)) with box durations seconds(r,
    phase, j): each box starts when its rank is free and the box it needs has ended (run_boxes).
    Returns the timelines (one list of dicts per rank). ValueError if some rank would wait
    forever."""
    rows = [[dict(stage=r, micro=j, phase=phase) for phase, j in ops]
            for r, ops in enumerate(orders)]
    return run_boxes(rows, lambda b, t: t + seconds(b["stage"], b["phase"], b["micro"]))


def replayed_bubble(timelines):
    """The bubble of the same orders with the measured box durations and free messages: what
    the schedule and the boxes' lengths make, without the machine's delays."""
    orders = [[(b["phase"], b["micro"]) for b in tl] for tl in timelines]
    took = {(r, b["phase"], b["micro"]): b["end"] - b["start"]
            for r, tl in enumerate(timelines) for b in tl}
    return timeline_bubble(replay_orders(orders, lambda r, ph, j: took[(r, ph, j)]))


def with_ready(timelines):
    """Copies of the boxes, each that needed another rank's output with `ready`: when that
    output was sent (the other rank's box's `sent`)."""
    p = len(timelines)
    sent = {(r, b["phase"], b["micro"]): b.get("sent") for r, tl in enumerate(timelines)
            for b in tl}
    out = []
    for r, tl in enumerate(timelines):
        boxes = []
        for b in tl:
            need = needs(r, b["phase"], b["micro"], p)
            ready = sent.get(need) if need is not None and need[0] != r else None
            boxes.append(dict(b, ready=ready) if ready is not None else dict(b))
        out.append(boxes)
    return out


def wait_parts(timelines):
    """Each rank's idle time in the step, split (runtime.emulate.waits): waiting for an input
    that had not been sent yet (the schedule), and the delay from its sending to the box's start
    (the message in flight, then the process waiting for a core: the machine). Also the idle
    time after the rank's last box. Seconds per rank: list of dict(idle, input, delay, tail)."""
    t0 = min(b["start"] for tl in timelines for b in tl)
    t1 = max(b["end"] for tl in timelines for b in tl)
    parts = []
    for tl in with_ready(timelines):
        w = waits(tl, step_start=t0)
        w["tail"] = t1 - max(b["end"] for b in tl)
        parts.append(w)
    return parts


def zero_bubble_rank_order(p, m, rank, f=1.0, b=1.0, w=1.0):
    """A zero-bubble order after ZB-H1 of Qi et al., without its memory bound: 1F1B's forwards and
    input-gradient backwards (B), each weight-gradient box (W) moved into the time the rank would
    otherwise wait. Found by running the schedule with box times f, b, w: a rank whose next F or
    B is not ready runs a pending W instead; the W left at the end run last. Each W held back
    keeps its layers' inputs and output gradients alive (here up to m on a rank; the published
    ZB-H1 bounds them)."""
    main = [one_f_one_b_rank_order(p, m, r) for r in range(p)]
    dur = {"F": f, "B": b, "W": w}
    pos, free, end = [0] * p, [0.0] * p, {}
    pending, orders = [[] for _ in range(p)], [[] for _ in range(p)]
    while any(pos[r] < 2 * m or pending[r] for r in range(p)):
        best = None                         # (start, rank, box): the earliest next box
        for r in range(p):
            nxt = main[r][pos[r]] if pos[r] < 2 * m else None
            ready = None
            if nxt is not None:
                need = needs(r, *nxt, p)
                ready = 0.0 if need is None else end.get(need)
            if ready is not None and (ready <= free[r] or not pending[r]):
                cand = (max(free[r], ready), r, nxt)
            elif pending[r]:
                cand = (free[r], r, ("W", pending[r][0]))
            else:
                continue
            best = min(best, cand) if best else cand
        start, r, (phase, j) = best
        free[r] = end[(r, phase, j)] = start + dur[phase]
        orders[r].append((phase, j))
        if phase == "W":
            pending[r].pop(0)
        else:
            pos[r] += 1
            if phase == "B":
                pending[r].append(j)
    return orders[rank]


def zero_bubble_bubble(p, m, f=1.0, b=1.0, w=1.0):
    """Idle share of ZB-H1 with box times f (forward), b (input gradient), w (weight gradient):
    each rank idles (p-1)(f + b - w) in a step of m(f + b + w) busy time."""
    validate_positive_int(p, "p")
    validate_positive_int(m, "m")
    idle = (p - 1) * (f + b - w)
    return idle / (m * (f + b + w) + idle)


def bubble_added(p, m):
    """What the bubble adds to the slowest stage's compute T = m t: the step takes
    (m + p - 1) t = T (1 + (p-1)/m), so (p-1)/m of T; (p-1)/(m+p-1) is its share of the step."""
    return (p - 1) / m
