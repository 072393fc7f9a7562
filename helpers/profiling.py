"""Part IV: torch.profiler without its native log lines, and counting what a step runs.

On a CUDA build without a GPU, the profiler's C++ side (kineto) writes lines such as
"gpuGetDeviceCount failed with code 35" and "profiler_start" straight to file descriptor 2,
past Python's sys.stderr. `quiet_profile`, the one set-up of every profile the course takes,
silences that descriptor while the profiler runs.
"""
import contextlib
import os
import sys

__all__ = ["quiet_native_stderr", "quiet_profile", "profile_cpu", "collectives_in", "count_ops",
           "trace_events", "overlap_ms", "exposed_ms", "trace_sentence"]


@contextlib.contextmanager
def quiet_native_stderr():
    """Send file descriptor 2 (what C++ libraries write to) to /dev/null meanwhile; Python's
    own warnings and errors still reach sys.stderr when it is not that descriptor."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


@contextlib.contextmanager
def quiet_profile(cuda=False, **kwargs):
    """torch.profiler.profile (yielded) of CPU activity, plus CUDA's when `cuda`, with
    `kwargs` (record_shapes, schedule, ...), without the native log lines: kineto's level
    raised, file descriptor 2 silenced."""
    from torch import profiler
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")   # no native INFO/WARNING lines
    activities = [profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(profiler.ProfilerActivity.CUDA)
    with quiet_native_stderr(), profiler.profile(activities=activities, **kwargs) as prof:
        yield prof


def profile_cpu(fn, steps=1, cuda=None):
    """Run fn() `steps` times under torch.profiler (CPU activity, plus CUDA where there is a
    GPU, or as `cuda` says) and return the profile; the devices are synchronised at the end."""
    import torch
    with quiet_profile(cuda=torch.cuda.is_available() if cuda is None else cuda) as prof:
        for _ in range(steps):
            fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    return prof


BACKEND_PREFIXES = ("gloo:", "nccl:")


def collectives_in(fn):
    """The collectives that fn() ran through its process group's backend, in the order they
    started: a list of (op, elements), op as the backend names it ('broadcast', 'all_reduce',
    ...) and elements the size of its first tensor (None where the profiler kept no shape).
    Read off torch.profiler, to which gloo and NCCL report each collective they run
    ('gloo:broadcast', ...): so it also sees the ones DDP's C++ reducer runs, which wrapping
    torch.distributed's Python functions (count_traffic) cannot. gloo runs its collectives on
    threads of its own, so two in flight together (two async all-reduces) may start in either
    order: compare those as a set; one waited for before the next is launched keeps its place.
    Under NCCL an entry is the launch, on the host."""
    import math
    with quiet_profile(record_shapes=True) as prof:
        fn()
    found = []
    for e in prof.events():
        if e.name.startswith(BACKEND_PREFIXES):
            shapes = e.input_shapes or [[]]
            size = math.prod(shapes[0]) if shapes[0] else None
            found.append((e.time_range.start, e.name.split(":", 1)[1], size))
    return [(op, size) for _, op, size in sorted(found, key=lambda f: f[0])]


def count_ops(prof, steps=1):
    """What a profiled step ran, per step: 'python_ops', the top-level aten:: operators (called
    from Python, not those nested inside other operators), and 'backward_nodes', the autograd
    functions that backward ran (each calls a few operators of its own). Nested aten:: events
    (an addmm inside a linear, a copy inside a to) are not counted: they are not separate calls.
    On a GPU most counted calls launch one or more kernels; views (flatten, tensor_split,
    detach, a view's backward) and a .to() to the device a tensor is already on launch none."""
    events = prof.events()
    top = [e for e in events if e.cpu_parent is None]
    python_ops = sum(1 for e in top if e.name.startswith("aten::"))
    backward = sum(1 for e in top if e.name.startswith("autograd::engine::evaluate_function"))
    return {"python_ops": python_ops / steps, "backward_nodes": backward / steps}


REGIONS = ("forward", "backward", "optimizer")
NCCL_KERNELS = ("ncclDevKernel", "ncclKernel")


def comm_events(evs):
    """The all-reduces that RAN, among a Chrome trace's events: gloo's (`gloo:all_reduce`, on
    its own threads) and, in a trace with GPU activity, NCCL's kernels on the GPU; the host's
    `nccl:all_reduce` record is only the launch (its kernel runs later), so it counts only
    where the trace has no GPU activity. The regions' copies on the GPU
    (`gpu_user_annotation`) are left out, so each region is counted once."""
    gpu = any(e.get("cat") == "kernel" for e in evs)
    return [e for e in evs if e.get("cat") != "gpu_user_annotation" and (
        e["name"].startswith("gloo:all_reduce") or
        (e["name"].startswith(NCCL_KERNELS) if gpu else e["name"].startswith("nccl:all_reduce")))]


def trace_events(path, regions=REGIONS):
    """The events of an exported Chrome trace (`prof.export_chrome_trace(path)`) that make a
    step's timeline: the record_function regions (lane 'compute'), the all-reduces that DDP
    launches (lane 'launch': `c10d::allreduce_` on the training thread) and the ones that ran
    (lane 'all-reduce', comm_events: gloo's threads, or NCCL's kernels on a GPU), and for each
    'backward' a 'reducer wait' from the end of its compute to the end of its all-reduces:
    on the host's clock from the last gradient's hook (see _host_cuts), or, in a trace with
    GPU activity, on the GPU's clock (lane 'gpu', see _gpu_windows: with NCCL the host only
    queues the work). A list of dicts name, lane, start_ms, dur_ms, step (counted from 0),
    times from the first region's start; a launch also has before_cut: True when it came
    inside a backward by the host's cut (the launch that makes the cut included; a launch in
    the reducer's wait, after it, is False), and before_last_node: True when it came before
    backward's last autograd node started, while autograd still had other gradients to compute
    (a launch from inside the last node, by the hook of its own gradient, is by the cut but
    not before the last node)."""
    import json
    with open(path) as f:
        trace = json.load(f)
    evs = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    gpu = any(e.get("cat") == "kernel" for e in evs)
    starts = sorted(float(e["ts"]) for e in evs
                    if e["name"] == regions[0] and e.get("cat") != "gpu_user_annotation")

    def step_at(ts):
        return max(sum(1 for s in starts if s <= ts) - 1, 0)

    # a GPU window takes the step of the host backward that launched its kernels (they run
    # after the host has moved on)
    picked = ([(ts, dur, name, lane, step_at(host)) for ts, dur, name, lane, host in
               _gpu_windows(evs)] if gpu else
              [(ts, dur, name, lane, step_at(ts)) for ts, dur, name, lane in
               _reducer_waits(evs, regions)])
    comm = {id(e) for e in comm_events(evs)}
    for e in evs:
        name = e["name"]
        if e.get("cat") == "gpu_user_annotation":
            continue                   # a region's copy on the GPU: the host's is the region
        lane = ("compute" if name in regions else "launch" if name.startswith("c10d::allreduce")
                else "all-reduce" if id(e) in comm else None)
        if lane:
            picked.append((float(e["ts"]), float(e["dur"]), name, lane, step_at(float(e["ts"]))))
    if not picked:
        return []
    t0 = starts[0] if starts else min(p[0] for p in picked)
    cuts = _host_cuts(evs)
    return [dict(name=name, lane=lane, start_ms=(ts - t0) / 1e3, dur_ms=dur / 1e3, step=step,
                 **({"before_cut": _before_cut(ts, cuts),
                     "before_last_node": _before_last_node(ts, cuts)}
                    if lane == "launch" else {}))
            for ts, dur, name, lane, step in sorted(picked)]


def _backward_kernels(evs):
    """For each host 'backward' region of a trace with GPU activity (in time order): its
    compute kernels and its NCCL kernels, as (start, end) pairs, a kernel belonging to the
    region in which the host launched it (the launch's `correlation` id names the kernel)."""
    launched = {e["args"]["correlation"]: float(e["ts"]) for e in evs
                if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    kernels = [(launched.get(e.get("args", {}).get("correlation")), float(e["ts"]),
                float(e["ts"]) + float(e["dur"]), e["name"].startswith(NCCL_KERNELS))
               for e in evs if e.get("cat") == "kernel"]
    out = []
    for e in sorted((e for e in evs if e["name"] == "backward"
                     and e.get("cat") != "gpu_user_annotation"), key=lambda e: float(e["ts"])):
        s0, s1 = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        mine = [k for k in kernels if k[0] is not None and s0 <= k[0] <= s1]
        out.append((float(e["ts"]), [(a, b) for _, a, b, nccl in mine if not nccl],
                    [(a, b) for _, a, b, nccl in mine if nccl]))
    return out


def _gpu_windows(evs):
    """On the GPU's clock, per backward: 'backward kernels' (lane 'gpu'), from its first compute
    kernel to its last, and 'reducer wait' (lane 'gpu'), from there to the end of its last NCCL
    kernel (none when the all-reduces ended first). With NCCL, DDP's backward() returns on the
    host once the work is queued, and its autograd nodes end long before their kernels run:
    the cut between compute and exposed all-reduce belongs on the GPU. Each window ends with
    the host time of its backward region (for its step)."""
    out = []
    for host, comp, comm in _backward_kernels(evs):
        if not comp:
            continue
        a, b = min(x for x, _ in comp), max(y for _, y in comp)
        out.append((a, b - a, "backward kernels", "gpu", host))
        last = max((y for _, y in comm), default=b)
        if last > b:
            out.append((b, last - b, "reducer wait", "gpu", host))
    return out


AUTOGRAD_NODE = "autograd::engine::evaluate_function"


def _host_cuts(evs):
    """Per host 'backward' region: (start, end, cut, last, last_end), `last` and `last_end` the
    start and end of the last autograd node that ran inside it on its thread, and the cut, where
    backward's compute ends, at the last gradient's hook: the first bucket launch
    (`c10d::allreduce_` on the same thread) from inside that node, after it started, where there
    is one (DDP's hook on the node's own gradient launched it; what the node ran after it is the
    hook's tail, not a gradient), else the node's end (all None when the trace has no node)."""
    def mine(name, s0, s1, e):
        return [(float(x["ts"]), float(x["ts"]) + float(x["dur"])) for x in evs
                if x["name"].startswith(name) and s0 <= float(x["ts"]) <= s1
                and (x.get("pid"), x.get("tid")) == (e.get("pid"), e.get("tid"))]
    out = []
    for e in evs:
        if e["name"] != "backward" or e.get("cat") == "gpu_user_annotation":
            continue
        s0, s1 = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        nodes = [(b, a) for a, b in mine(AUTOGRAD_NODE, s0, s1, e) if b <= s1]
        if not nodes:
            out.append((s0, s1, None, None, None))
            continue
        end, last = max(nodes)
        hooked = [a for a, _ in mine("c10d::allreduce", s0, s1, e) if last <= a < end]
        out.append((s0, s1, min(hooked, default=end), last, end))
    return out


def _reducer_waits(evs, regions):
    """One 'reducer wait' region (lane 'compute') per 'backward' region: from its cut (the last
    gradient's hook, see _host_cuts) to the region's end. Under torch's DDP, backward() returns
    only after the reducer's end-of-backward callback has waited for every bucket's all-reduce,
    so that tail is the wait, not compute; where the hook launched the last bucket from inside
    the last node, the wait starts there and holds the rest of that node, which computes no
    gradient."""
    if "backward" not in regions:
        return []
    return [(cut, s1 - cut, "reducer wait", "compute") for _, s1, cut, _, _ in _host_cuts(evs)
            if cut is not None]


def _before_cut(ts, cuts):
    """Whether a launch at host time `ts` came inside a backward region by its cut: before it,
    or as the launch that makes it (by the last gradient's hook, inside the last node)."""
    return any(s0 <= ts and (ts < cut or ts == cut < end)
               for s0, _, cut, _, end in cuts if cut is not None)


def _before_last_node(ts, cuts):
    """Whether a launch at host time `ts` came inside a backward region before its last
    autograd node started: while autograd still had other gradients to compute."""
    return any(s0 <= ts < last for s0, _, _, last, _ in cuts if last is not None)


def _union(spans):
    """Sorted, non-overlapping spans covering the same time as `spans` (start, end) pairs."""
    out = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def overlap_ms(events, region="backward"):
    """(ms during which some all-reduce ran while `region` was running, ms during which some
    all-reduce ran at all): how much communication the region hid. Concurrent all-reduces (gloo
    runs several threads) count once."""
    comm = _union((e["start_ms"], e["start_ms"] + e["dur_ms"]) for e in events
                  if e["lane"] == "all-reduce")
    spans = [(e["start_ms"], e["start_ms"] + e["dur_ms"]) for e in events if e["name"] == region]
    hidden = sum(max(0.0, min(b, s1) - max(a, s0)) for a, b in comm for s0, s1 in spans)
    return hidden, sum(b - a for a, b in comm)


def _overlap(spans, windows):
    """ms of the (start, end) `spans` that fall inside the (start, end) `windows`."""
    return sum(max(0.0, min(b, s1) - max(a, s0)) for a, b in spans for s0, s1 in windows)


def _length(spans):
    return sum(b - a for a, b in spans)


def _minus(spans, holes):
    """The parts of the (start, end) `spans` outside every one of `holes` (both sorted,
    non-overlapping: _union's)."""
    out = []
    for a, b in spans:
        t = a
        for h0, h1 in holes:
            if h1 <= t or h0 >= b:
                continue
            if h0 > t:
                out.append((t, h0))
            t = max(t, h1)
        if b > t:
            out.append((t, b))
    return out


def _step_windows(events, on_gpu):
    """Per backward, in time order: ((compute start, compute end), its wait's (start, end) or
    None). On the host the compute ends where the step's 'reducer wait' begins (the last
    gradient's hook, see _host_cuts), else at the region's end; on a GPU it is the 'backward
    kernels' span."""
    if on_gpu:
        waits = {e["step"]: e for e in events if e["name"] == "reducer wait"
                 and e["lane"] == "gpu"}
        comp = [e for e in events if e["name"] == "backward kernels"]
        spans = [(e["step"], e["start_ms"], e["start_ms"] + e["dur_ms"]) for e in comp]
    else:
        waits = {e["step"]: e for e in events if e["name"] == "reducer wait"}
        spans = [(e["step"], e["start_ms"], waits[e["step"]]["start_ms"] if e["step"] in waits
                  else e["start_ms"] + e["dur_ms"]) for e in events if e["name"] == "backward"]
    out = []
    for step, c0, c1 in sorted(spans, key=lambda x: x[1]):
        w = waits.get(step)
        out.append(((c0, c1), None if w is None else (w["start_ms"], w["start_ms"] + w["dur_ms"])))
    return out


def exposed_ms(events):
    """A DDP trace's all-reduce time (helpers.trace_events) split at the end of each backward's
    compute, in ms: overlapped, exposed, outside (late, stale), total, windows, wait (wait_busy,
    wait_idle), and the clock; each is defined below."""
    # Split the all-reduce time of a DDP trace (helpers.trace_events) at the end of each
    # backward's compute, each all-reduce record tied to its own step: the backward window it
    # began in. {'overlapped': ms of all-reduce while its own backward still computed,
    # 'exposed': ms of all-reduce inside its own backward's reducer wait (backward had no compute
    # left and backward() waited for it), 'outside': ms of all-reduce outside its own window
    # (neither: the step did not wait for it there), of which 'late' ran on after its own window
    # had ended (in all-reduces that began inside it; of that, 'stale' ms fell inside a later
    # step's window, where they are not counted as that step's overlap or wait) and the rest,
    # outside - late, in all-reduces that began outside every window; 'total' (overlapped +
    # exposed + outside: concurrent records count once, an instant counted with the step whose
    # own all-reduce ran then, if any), 'windows': ms of the backward windows, 'wait': ms of the
    # 'reducer wait' regions, of which 'wait_busy' ms had some all-reduce record open (its own
    # step's or a late one of an earlier step) and 'wait_idle' ms had none (the reducer waited
    # with nothing in flight in the trace: for its threads to get a core, say, or for the other
    # rank; the trace does not say which), 'clock': 'host' or 'gpu'}.
    # On the host (gloo) a window is the region 'backward', its compute ending at the last
    # gradient's hook (the first bucket launch from inside its last autograd node, else that
    # node's end: a bucket launched there starts no earlier, so it cannot count as overlapped)
    # and the reducer's wait after it; in a trace with GPU activity (NCCL) it is
    # 'backward kernels' and the 'reducer wait' after them, on the GPU's clock. Gloo can leave
    # time outside: it marks an all-reduce's result ready, which ends the reducer's wait and lets
    # backward() return, before it closes the all-reduce's record in the trace (torch's
    # ProcessGroupGloo: the Future is completed, then Work::finish ends the record), and such a
    # record can stay open into the next step's forward and backward. A region 'backward' alone
    # cannot tell overlapped from exposed: under DDP it ends after the wait.
    records = [(e["start_ms"], e["start_ms"] + e["dur_ms"]) for e in events
               if e["lane"] == "all-reduce"]
    on_gpu = any(e["lane"] == "gpu" for e in events)
    steps = _step_windows(events, on_gpu)
    own, tails, windows = [], [], []
    overlapped = 0.0
    for (c0, c1), wait in steps:
        w1 = max(c1, wait[1]) if wait else c1
        mine = [(a, b) for a, b in records if c0 <= a < w1]     # began in this window
        inside = _union((a, min(b, w1)) for a, b in mine)
        overlapped += _overlap(inside, [(c0, c1)])
        own += inside
        tails += [(w1, b) for a, b in mine if b > w1]
        windows.append((c0, w1))
    comm, own, windows = _union(records), _union(own), _union(windows)
    total, inside = _length(comm), _length(own)
    late = _minus(_union(tails), own)
    waits = _union(w for _, w in steps if w is not None)
    busy = _overlap(comm, waits)
    return dict(overlapped=overlapped, exposed=inside - overlapped, outside=total - inside,
                late=_length(late), stale=_overlap(late, windows), total=total,
                windows=_length(windows), wait=_length(waits), wait_busy=busy,
                wait_idle=_length(waits) - busy, clock="gpu" if on_gpu else "host")


def trace_sentence(backend):
    """What a DDP trace of `backend` ('gloo' or 'nccl') shows and where its cut lies, in the
    words of the profile chapter: the gloo trace is of CPU processes, the NCCL one of GPUs."""
    if backend == "nccl":
        return ("This trace is of NCCL on GPUs: `helpers.ddp_trace` profiled "
                "`ProfilerActivity.CUDA` too, so the all-reduce lane is NCCL's kernels on the "
                "GPU, and backward's compute ends at its last kernel there (the lane "
                "\"backward's kernels\"), not at its last autograd node on the host, which "
                "only queued the kernels.")
    if backend == "gloo":
        return ("This trace is of gloo on CPU processes: each has one core for its training "
                "thread and gloo's threads together, so they take turns on it. On GPUs "
                "`helpers.ddp_trace` profiles `ProfilerActivity.CUDA` too, and the cut moves "
                "to the GPU: the all-reduce lane is then NCCL's kernels, and backward's "
                "compute ends at its last kernel, since the host only queues them.")
    raise ValueError(f"backend {backend!r}: a DDP trace is of 'gloo' or 'nccl'")
