"""The profile chapter's words for its DDP trace (Part IV): when the bucket all-reduces were
launched against backward's last autograd node, where the all-reduce time fell against the
region "backward", and what the reducer's wait after the last gradient's hook was made of. Each
sentence is chosen by the measured split (helpers.profiling.exposed_ms), never by a template."""
from ...words import plural
from .profile_verdicts import _ms

__all__ = ["bucket_launch_words", "trace_region_words", "reducer_wait_words", "trace_actor_words",
           "trace_cut_words", "OUTSIDE_MS",
           "WAIT_IDLE_MS"]


def bucket_launch_words(launched, before_cut, before_last):
    """When DDP launched its bucket all-reduces in a trace, counted against backward's last
    autograd node: `launched` in all, `before_cut` by the cut (helpers.trace_events: the first
    launch from inside that node, by its gradient's hook, else the node's end), `before_last`
    before the node started (while autograd still had other gradients to compute). A launch
    between the two came from inside the last node, once its own gradient was in; one after
    the cut, from the reducer's wait."""
    if not 0 <= before_last <= before_cut <= launched:
        raise ValueError(f"bucket_launch_words: need 0 <= before_last ({before_last}) <= "
                         f"before_cut ({before_cut}) <= launched ({launched})")
    head = f"DDP launched {plural(launched, 'bucket all-reduce')}"
    if before_last == launched:
        return (head + ", all of them before backward's last autograd node started, while "
                "autograd still had gradients to compute")
    inside = before_cut - before_last
    if before_cut == launched:
        return (head + f", all before backward's last autograd node ended: {before_last} before "
                "it started, while autograd still had other gradients to compute, and "
                f"{inside} from inside that last node, once its own gradient was in")
    return (head + f", {before_last} before backward's last autograd node started, {inside} "
            f"from inside it, by its gradient's hook, and {launched - before_cut} later, in the "
            "reducer's wait")


# Below this (half a microsecond: under the trace's microsecond stamps) no all-reduce time is said
# to lie outside backward's windows.
OUTSIDE_MS = 0.0005


def _small_ms(x):
    """Milliseconds as _ms, with three decimals below 0.01 (a 0.004 ms piece is not '0.00')."""
    return f"{x:.3f}" if abs(x) < 0.01 else _ms(x)


def trace_region_words(split):
    """Where a DDP trace's all-reduce time fell against backward's windows, from
    helpers.exposed_ms's split, each all-reduce against its own step's window: all of it inside
    (on the host the region "backward", which under DDP ends only once the reducer has waited
    for every bucket; on a GPU backward's kernels and the wait after them), or all but `outside`
    ms, said as measured: ms that ran on after its window had ended in all-reduces that began
    inside it (`late`; of them `stale` ms inside a later step's window, said where there are
    any: not that step's overlap), and ms of all-reduces that began outside every window (the
    rest). Gloo closes an all-reduce's record in the trace after
    marking its result ready, which is what lets backward() return, so on the host a late piece
    has a known way to happen; what held the records open that long is not measured, and a piece
    that began outside is not explained. The outside ms are counted neither as overlapped nor
    as exposed (the sentence says so): backward() did not wait for them."""
    total, outside, late, windows = (split[k] for k in ("total", "outside", "late", "windows"))
    stale = split.get("stale", 0.0)
    if not -1e-9 <= stale <= late + 1e-9 <= outside + 2e-9 <= total + 3e-9:
        raise ValueError(f"trace_region_words: need 0 <= stale ({stale}) <= late ({late}) <= "
                         f"outside ({outside}) <= total ({total})")
    host = split["clock"] == "host"
    region = (f'the region "backward" ({windows:.1f} ms in all)' if host else
              f"backward's windows on the GPU, from its first kernel to the end of the "
              f"all-reduce kernels it launched ({windows:.1f} ms in all)")
    region += ", each all-reduce in the one it began in"
    if outside < OUTSIDE_MS:
        return (f"All of it falls inside {region}" + (
            ": under DDP `backward()` returns only once the reducer has waited for every "
            "bucket's all-reduce" if host else ""))
    other = outside - late
    pieces = []
    if late >= OUTSIDE_MS:
        after = "`backward()` had returned" if host else "its window had ended"
        pieces.append(f"{_small_ms(late)} ms ran on after {after}, in all-reduces that began "
                      "inside it" + (f", {_small_ms(stale)} ms of them on into a later step's "
                                     "backward, where they count as neither its overlap nor "
                                     "its wait" if stale >= OUTSIDE_MS else ""))
    if other >= OUTSIDE_MS:
        pieces.append(f"{_small_ms(other)} ms in all-reduces that began outside every "
                      "backward, which this run does not explain")
    words = f"All but {_small_ms(outside)} ms of it falls inside {region}: " + "; and ".join(
        pieces)
    if late >= OUTSIDE_MS and host:
        words += (". Gloo marks an all-reduce's result ready, which ends the reducer's wait and "
                  "lets `backward()` return, before it closes the all-reduce's record in the "
                  "trace, so a record can end after `backward()` has returned; what held these "
                  "records open that long, the trace does not show")
    elif late >= OUTSIDE_MS:
        words += ", which this run does not explain"
    return (words + f". Those {_small_ms(outside)} ms are counted below neither as overlapped "
            "nor as exposed: `backward()` did not wait for them")


# Below this (50 microseconds, a gloo thread's wake-up) the reducer's wait with no all-reduce record
# open is not said apart from the exposed all-reduce.
WAIT_IDLE_MS = 0.05

_HARDWARE = ("is what the communication adds to a step where communication runs on hardware of "
             "its own, and even there not quite (on a GPU NCCL's kernels take some of its SMs and "
             "memory bandwidth)")


def reducer_wait_words(split):
    """What the reducer-wait regions of a DDP trace held, from helpers.exposed_ms's split: an
    all-reduce record open throughout (`wait_idle` under WAIT_IDLE_MS: the exposed time is what
    the communication adds), some of it with none open (the wait in two parts, said apart: the
    step lost the whole wait, and only the part with an all-reduce running is communication the
    trace shows), or none open at all (the wait is not attributed). What the reducer waited for
    with nothing in flight (the rest of the hook that launched the last bucket, where the wait
    starts, its threads to get a core, the other rank) is not measured, and is said so. Records
    open in the wait beyond the step's own exposed all-reduce (an earlier step's, late) are
    named where they reach the floor."""
    wait, busy, idle, exposed = (split[k] for k in ("wait", "wait_busy", "wait_idle", "exposed"))
    if not (-1e-9 <= busy <= wait + 1e-9 and -1e-9 <= idle
            and abs(busy + idle - wait) < 1e-6 and exposed <= busy + 1e-6):
        raise ValueError(f"reducer_wait_words: need exposed ({exposed}) <= wait_busy ({busy}), "
                         f"and wait_busy + wait_idle ({idle}) = wait ({wait})")
    regions = f"The purple reducer-wait regions, {_ms(wait)} ms in all,"
    if idle < WAIT_IDLE_MS:
        return (f"{regions} had an all-reduce running throughout: that exposed time, not the "
                f"all-reduce's total, {_HARDWARE}")
    nothing = ("`backward()` waited with no all-reduce running in the trace, nothing in flight "
               "that it shows (finishing the hook that launched the last bucket, waiting for "
               "gloo's threads to get the core, say, or for the other rank: this trace does not "
               "attribute it)")
    if busy < WAIT_IDLE_MS:
        return (f"{regions} had no all-reduce running in them: {nothing}. The step lost those "
                f"{_ms(wait)} ms, and this trace does not show them as communication")
    other = busy - exposed
    running = (f"an all-reduce ran in {_ms(busy)} ms of them" + (
        f" (the exposed {_ms(exposed)} ms, and {_ms(other)} ms of an earlier step's all-reduce "
        "still open)" if other >= WAIT_IDLE_MS else ", the exposed time"))
    return (f"{regions} were not all communication: {running}; in the other {_ms(idle)} ms "
            f"{nothing}. The step lost the whole wait; of it, only the part with an all-reduce "
            f"running, not the all-reduce's total, {_HARDWARE}")


def trace_actor_words(backend):
    """Who all-reduced in a DDP trace of `backend`: NCCL's kernels, or gloo's threads."""
    if backend == "nccl":
        return "NCCL's kernels"
    if backend == "gloo":
        return "Gloo's threads"
    raise ValueError(f"backend {backend!r}: a DDP trace is of 'gloo' or 'nccl'")


def trace_cut_words(clock):
    """Where a trace's split (helpers.exposed_ms) cut backward: on the host at the last
    gradient's hook, inside its last autograd node ('host': the hook's first bucket launch
    there, else the node's end), on the GPU at its last kernel ('gpu')."""
    if clock == "host":
        return "the last gradient's hook, inside backward's last autograd node"
    if clock == "gpu":
        return "backward's last kernel on the GPU"
    raise ValueError(f"clock {clock!r}: a trace's split is cut on the 'host' or the 'gpu'")
