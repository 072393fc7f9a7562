"""Checks for the exercises of the foundation chapter (gpus): counting work, bytes and copy time,
fitting the copy model to measurements, placing an operation against the roofline, and naming
the link between two visible GPUs."""
import math

import torch

from ._core import (
    CheckFailed,
    as_number,
    as_pair,
    check,
    expect,
    fresh_generator,
    number_words,
    randint,
    same_number,
    uniform,
)
from ._visible_gpus import raises_beyond, specs, topology, visible

__all__ = ["check_matmul_flops", "check_tensor_bytes", "check_copy_time", "check_fit_copy_model",
           "check_roofline_time", "check_link_between"]

def _number(value, call):
    return as_number(value, call, with_dtype=True)


# ---------------------------------------------------------------------------------------------
@check("matmul_flops", observes=["the number returned for fresh sizes n, small to 8192, "
                                 "against 2·n³ within the rounding of the type returned"])
def check_matmul_flops(fn):
    """fn(n) returns the floating-point operations of an n×n by n×n matrix product: 2·n³."""
    g = fresh_generator()
    ns = sorted({randint(g, 2, 40), randint(g, 41, 600), randint(g, 601, 8192)})
    seen = {}
    for n in ns:
        got, dtype = _number(fn(n), f"matmul_flops({n})")
        want = 2 * n**3
        seen[n] = got
        if same_number(got, n**3, dtype, 2):
            expect(False, f"matmul_flops({n}) returned n³ = {n**3}: each of the n³ "
                          "multiply-adds is two operations, a multiply and an add")
        if same_number(got, 2 * n**2, dtype, 2):
            expect(False, f"matmul_flops({n}) returned 2·n² = {2 * n**2}: each of the n² "
                          "output entries needs n multiplies and n adds")
        got_s, want_s = number_words(got, want, dtype)
        expect(same_number(got, want, dtype, 4),
               f"matmul_flops({n}) returned {got_s}, expected 2·n³ = {want_s}")
    expect(len(set(seen.values())) == len(seen),
           f"matmul_flops returned the same value for different n: {seen}")


# ---------------------------------------------------------------------------------------------
_DTYPES = (torch.float32, torch.float16, torch.int64, torch.bool)


def _random_tensors(g, count):
    """Tensors of random dtypes and shapes, the first a view of a larger one (its storage's
    bytes are not its own)."""
    tensors = []
    for i in range(count):
        dtype = _DTYPES[randint(g, 0, len(_DTYPES) - 1)]
        shape = tuple(randint(g, 1, 9) for _ in range(randint(g, 1, 3)))
        base = torch.zeros((2 * shape[0] + 1, *shape[1:]) if i == 0 else shape, dtype=dtype)
        tensors.append(base[::2][:shape[0]] if i == 0 else base)
    return tensors


def _shared_storage(g):
    """A tensor, its transpose, one of its rows and the same tensor again, in a random order:
    one storage, counted per tensor (never equal to a count per storage, nor to a fixed number
    of bytes per element, with 2 rows or more)."""
    dtype = _DTYPES[randint(g, 0, len(_DTYPES) - 1)]
    rows, cols = randint(g, 2, 9), randint(g, 2, 9)
    base = torch.zeros(rows, cols, dtype=dtype)
    tensors = [base, base.t(), base[randint(g, 0, rows - 1)], base]
    return [tensors[i] for i in torch.randperm(len(tensors), generator=g).tolist()]


def _per_storage(tensors):
    """The totals of an answer that counts tensors sharing a storage once, if any do: keyed by
    storage, address or object, the smallest or largest one's bytes (in _shared_storage's list
    the first's and the last's are among them), or the storage's own."""
    storage = lambda t: t.untyped_storage().data_ptr()
    if len({storage(t) for t in tensors}) == len(tensors):
        return set()
    totals = {sum({storage(t): t.untyped_storage().nbytes() for t in tensors}.values())}
    for key in (storage, lambda t: t.data_ptr(), id):
        groups = {}
        for t in tensors:
            groups.setdefault(key(t), []).append(t.numel() * t.element_size())
        totals |= {sum(pick(b) for b in groups.values()) for pick in (min, max)}
    return totals


def _describe(ts):
    def note(i, t):
        same = next((j for j in range(i) if ts[j] is t), None)
        shared = next((j for j in range(i) if ts[j].untyped_storage().data_ptr()
                       == t.untyped_storage().data_ptr()), None)
        if same is not None:
            return f" (entry {same + 1} again)"
        if shared is not None:
            return f" (sharing entry {shared + 1}'s storage)"
        return " (a view)" if t._base is not None else ""
    return "[" + ", ".join(f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}" + note(i, t)
                           for i, t in enumerate(ts)) + "]"


@check("tensor_bytes", references=["held_bytes"],
       observes=["the bytes returned for fresh lists of tensors of mixed dtypes (one list holds "
                 "every dtype, one a tensor, its transpose, one of its rows and the same tensor "
                 "again), against numel × element_size of each"])
def check_tensor_bytes(fn):
    """fn(tensors) returns the total bytes a list of tensors occupies (numel × element_size)."""
    g = fresh_generator()
    trials = [_random_tensors(g, randint(g, 1, 5)) for _ in range(6)]
    # at least one list mixing every dtype, so a fixed bytes-per-element cannot pass
    mixed = _random_tensors(g, 4)
    trials.append([t.to(dtype) for t, dtype in zip(mixed, _DTYPES, strict=True)])
    # one list whose tensors share a storage, so that counting each storage once cannot pass
    trials.insert(randint(g, 0, len(trials)), _shared_storage(g))
    for tensors in trials:
        got = as_number(fn(list(tensors)), f"tensor_bytes({_describe(tensors)})")
        want = sum(t.numel() * t.element_size() for t in tensors)    # after the answer ran
        if got == want:
            continue
        numel = sum(t.numel() for t in tensors)
        stored = sum(t.untyped_storage().nbytes() for t in tensors)
        expect(got != stored, f"for {_describe(tensors)} you returned {got:g}, the bytes of "
                              f"their storages (a view shares its base's); expected {want}, "
                              "numel() × element_size() of each tensor")
        expect(got not in _per_storage(tensors),
               f"for {_describe(tensors)} you returned {got:g}, counting the tensors that share "
               f"memory once; expected {want}: numel() × element_size() of each tensor in the "
               "list, a view or the same tensor again counted as if it were its own")
        expect(got != numel, f"for {_describe(tensors)} you returned {got:g}, the number of "
                             f"elements; the tensors occupy {want} bytes: multiply each "
                             "tensor's numel() by its element_size()")
        for size in (2, 4, 8):
            expect(got != size * numel,
                   f"for {_describe(tensors)} you returned {got:g}, as if every element took "
                   f"{size} bytes; expected {want}: float32 takes 4, float16 2, int64 8 and "
                   "bool 1 byte (element_size())")
        expect(False, f"for {_describe(tensors)} you returned {got:g}, expected {want} bytes "
                      "(sum of numel() × element_size())")


# ---------------------------------------------------------------------------------------------
@check("copy_time", observes=["the time returned for fresh sizes, bandwidths and latencies "
                              "where both terms matter, and for a copy of 0 bytes"])
def check_copy_time(fn):
    """fn(num_bytes, bandwidth_gbs, latency_s) returns latency_s + num_bytes / (bandwidth_gbs·1e9),
    the alpha-beta model of a copy."""
    g = fresh_generator()
    results = set()
    for _ in range(6):
        bandwidth_gbs = randint(g, 5, 900) / 2          # GB/s: PCIe to NVLink
        latency_s = randint(g, 1, 500) * 1e-7            # 0.1 µs to 50 µs
        ratio = randint(g, 20, 500) / 100                # both terms matter
        num_bytes = max(1, round(latency_s * bandwidth_gbs * 1e9 * ratio))
        transfer = num_bytes / (bandwidth_gbs * 1e9)
        call = f"copy_time({num_bytes}, {bandwidth_gbs}, {latency_s:.2e})"
        got, dtype = _number(fn(num_bytes, bandwidth_gbs, latency_s), call)
        want = latency_s + transfer                                   # after the answer ran
        results.add(got)
        if same_number(got, want, dtype, 8):
            continue
        close = lambda x, got=got, dtype=dtype: same_number(got, x, dtype, 8)
        got_s, want_s = number_words(got, want, dtype, 4, " s")
        expect(not close(transfer), f"{call} returned {got_s}, expected {want_s}: the "
               "latency term is missing (every copy pays latency_s before the first byte)")
        expect(not close(latency_s), f"{call} returned {got_s}, expected {want_s}: the "
               "bandwidth term num_bytes / (bandwidth_gbs·1e9) is missing")
        expect(not close(latency_s + num_bytes / bandwidth_gbs),
               f"{call} returned {got_s}, expected {want_s}: bandwidth_gbs is in GB/s, "
               "multiply it by 1e9 to get bytes per second")
        expect(not close(latency_s + num_bytes / (bandwidth_gbs * 2**30)),
               f"{call} returned {got_s}, expected {want_s}: a GB here is 1e9 bytes, "
               "not 2**30")
        expect(False, f"{call} returned {got_s}, expected latency_s + "
                      f"num_bytes / (bandwidth_gbs·1e9) = {want_s}")
    expect(len(results) > 1, "copy_time returned the same value for every input")
    latency_s = randint(g, 1, 500) * 1e-7
    got, dtype = _number(fn(0, 100.0, latency_s), f"copy_time(0, 100.0, {latency_s:.2e})")
    got_s, want_s = number_words(got, latency_s, dtype, 4, " s")
    expect(same_number(got, latency_s, dtype, 8), f"copy_time(0, 100.0, {latency_s:.2e}) returned "
                                                  f"{got_s}: a copy of 0 bytes takes latency_s "
                                                  f"= {want_s}")


# ---------------------------------------------------------------------------------------------
def _misfit(nbytes, seconds, alpha, gbs):
    """The weighted least-squares objective of the exercise: Σ ((t - α - b/β) / t)²."""
    beta = gbs * 1e9
    return math.fsum(((t - alpha - b / beta) / t) ** 2
                     for b, t in zip(nbytes, seconds, strict=True))


def _best_fit(nbytes, seconds, dtype=torch.float64):
    t = torch.tensor(seconds, dtype=dtype)
    b = torch.tensor(nbytes, dtype=dtype)
    A = torch.stack([torch.ones_like(b), b], dim=1) / t[:, None]
    alpha, slope = torch.linalg.lstsq(A, torch.ones(len(t), 1, dtype=dtype)) \
        .solution.squeeze(1).tolist()
    return alpha, 1 / slope / 1e9


def _measurements(g):
    """Copy times made at a random latency and bandwidth: 3% noise, and one copy (not the
    smallest) that a busy machine made 60% slower, as a real measurement has."""
    alpha = uniform(g, 2e-6, 5e-5)                     # 2 to 50 µs
    gbs = uniform(g, 1, 200)                          # 1 to 200 GB/s
    top = math.log10(300 * alpha * gbs * 1e9)         # the largest copy: 300× alpha's bytes
    count = randint(g, 10, 16)
    nbytes = [round(10 ** (1.8 + (top - 1.8) * i / (count - 1))) for i in range(count)]
    # the noise in Python's floats (the same float64 values): tensor arithmetic before the
    # answer's call is work a reader's global hook could watch
    noise = [1 + 0.06 * (e - 0.5)
             for e in torch.rand(count, generator=g, dtype=torch.float64).tolist()]
    seconds = [(alpha + b / (gbs * 1e9)) * e for b, e in zip(nbytes, noise, strict=True)]
    slow = randint(g, count - 2, count - 1)            # one of the two largest copies
    seconds[slow] *= 1.6
    return nbytes, seconds, alpha, gbs


@check("fit_copy_model", references=["fit_alpha_beta"], observes=[
    "the pair returned for fresh copy times (random latency and bandwidth, 3% noise, one copy "
    "60% slow): its misfit Σ((t − α − b/β)/t)², against the weighted least-squares optimum "
    "the check computes on the same data"])
def check_fit_copy_model(fn):
    """fn(nbytes, seconds) returns (latency_s, bandwidth_gbs) fitted to measured copy times
    t = latency_s + nbytes / (bandwidth_gbs·1e9), weighing each copy by 1/t. Judged by how well
    the returned model fits the data, against the best weighted fit: an answer that reads two
    points, or fits without the weights, is far from it."""
    g = fresh_generator()
    for _ in range(4):
        nbytes, seconds, alpha, gbs = _measurements(g)
        call = f"fit_copy_model on {len(nbytes)} copies of {nbytes[0]} to {nbytes[-1]} bytes"
        lat, bw = as_pair(fn(list(nbytes), list(seconds)), call, "latency_s, bandwidth_gbs")
        expect(bw > 0 and math.isfinite(bw) and math.isfinite(lat),
               f"{call}: bandwidth {bw:.3g} GB/s; a bandwidth is a positive number")
        best = _misfit(nbytes, seconds, *_best_fit(nbytes, seconds))
        got = _misfit(nbytes, seconds, lat, bw)
        if got <= best * 1.005 + 1e-12:        # rounding of a float64 fit: far below
            continue
        expect(not math.isclose(bw, gbs * 1e9, rel_tol=0.3),
               f"{call}: bandwidth {bw:.3g} looks like bytes/s: return GB/s (divide by 1e9)")
        expect(not math.isclose(bw * gbs * 1e9, 1, rel_tol=0.3) and
               not math.isclose(bw * gbs, 1, rel_tol=0.3),
               f"{call}: {bw:.3g} is seconds per byte (the slope): the bandwidth is its inverse")
        # the same weighted fit in float32 (torch.tensor(seconds)): lstsq drops the 1/t column
        lat32, bw32 = _best_fit(nbytes, seconds, torch.float32)
        expect(abs(lat32) >= 0.05 * alpha or abs(lat - lat32) > 0.01 * alpha
               or not math.isclose(bw, bw32, rel_tol=0.01), f"{call}: latency {lat:.3g} s: "
               "that is the weighted fit solved in float32 (torch.tensor of Python floats), where "
               f"the 1/t column, up to {nbytes[-1]:.0e} times below the b/t one, is lost with the "
               "latency: fit in float64 (dtype=torch.float64)")
        expect(lat > 0.05 * alpha, f"{call}: latency {lat:.3g} s, but every copy here took at "
               f"least {min(seconds):.3g} s: the smallest copies show the latency; a fit with each "
               "copy weighed by 1/t lets them count")
        expect(False, f"{call}: your model (α = {lat:.3g} s, β = {bw:.3g} GB/s) misses the "
                      f"measurements by {math.sqrt(got / len(nbytes)):.1%} on average (relative), "
                      f"a least-squares fit weighted by 1/t by {math.sqrt(best / len(nbytes)):.1%}:"
                      " fit all the copies, each equation weighed by 1/t (reading two points, or "
                      "an unweighted fit, lets a few copies decide)")


# ---- gpus: the least time an operation takes on a machine's two roofs -------------------------
def _operations(g, count=8):
    """(flops, nbytes, peak FLOP/s, memory bytes/s) of fresh operations and machines, memory-bound
    and compute-bound in turn, their two times at least 1.4x apart (no tie to argue about)."""
    # The first two, forced: a memory-bound operation more intense than a compute-bound one (on
    # machines of different balance), so no balance point fixed in advance sorts both right.
    dense = 10 ** uniform(g, 1, 2)                              # the compute-bound one, FLOP/B
    sparse = dense * 10 ** uniform(g, 0.3, 1)                   # the memory-bound one, denser
    ops = []
    for k in range(count):
        bw = float(f"{10 ** uniform(g, 10, 11.3 if k == 0 else 13):.3g}")   # 10 GB/s to 10 TB/s
        side = 1 if k % 2 else -1                               # right, then left of balance
        if k < 2:
            intensity = sparse if k == 0 else dense
            peak = float(f"{intensity * 10 ** (-side * uniform(g, 0.15, 1)) * bw:.3g}")
        else:
            peak = float(f"{10 ** uniform(g, 10, 15.3):.3g}")  # 10 GFLOP/s to 2 PFLOP/s
            intensity = peak / bw * 10 ** (side * uniform(g, 0.15, 2))
        flops = round(10 ** uniform(g, 6, 13))
        ops.append((flops, max(1, round(flops / intensity)), peak, bw))
    return ops


def _bound_word(value, call):
    word = str(value).strip().lower() if isinstance(value, str) else ""
    for bound in ("memory", "compute"):
        if word.startswith(bound):
            return bound
    raise CheckFailed(f"{call} returned {value!r} as the bound: return the string 'memory' or "
                      "'compute', the roof that sets the least time")


@check("roofline_time", observes=[
    "the seconds and the bound returned for fresh operations and machines (random FLOPs, bytes, "
    "peak FLOP/s and memory bandwidth; memory-bound and compute-bound in turn, one memory-bound "
    "operation more intense than a compute-bound one), against "
    "max(FLOPs / peak, bytes / bandwidth) and the roof that sets it"])
def check_roofline_time(fn):
    """fn(flops, nbytes, peak_flops, mem_bytes_per_s) returns (seconds, bound): the least time the
    roofline allows, max(flops / peak_flops, nbytes / mem_bytes_per_s), and 'memory' or
    'compute', whichever of the two sets it."""
    g = fresh_generator()
    for flops, nbytes, peak, bw in _operations(g):
        call = f"roofline_time({flops}, {nbytes}, {peak:.3g}, {bw:.3g})"
        got = fn(flops, nbytes, peak, bw)
        expect(isinstance(got, (tuple, list)) and len(got) == 2,
               f"{call} returned {got!r}: expected a pair (seconds, bound)")
        seconds, dtype = _number(got[0], call)
        bound = _bound_word(got[1], call)
        compute_s, memory_s = flops / peak, nbytes / bw        # after the answer ran
        want = max(compute_s, memory_s)
        want_bound = "memory" if memory_s > compute_s else "compute"
        close = lambda x, s=seconds, d=dtype: same_number(s, x, d, 8)
        got_s, want_s = number_words(seconds, want, dtype, 4, " s")
        shown = f"{call} returned {got_s}, expected {want_s}"
        if not close(want):
            expect(not close(compute_s + memory_s), f"{shown}: the sum of the two times. The "
                   "roofline lets the arithmetic and the memory traffic overlap, so the least "
                   "time is the larger of the two, not their sum")
            smaller = ("flops / peak_flops, the time of the arithmetic" if want_bound == "memory"
                       else "nbytes / mem_bytes_per_s, the time of the memory traffic")
            slower = ("moving nbytes at mem_bytes_per_s" if want_bound == "memory" else
                      "doing flops at peak_flops")
            expect(not close(compute_s) and not close(memory_s), f"{shown}: {smaller}, but "
                   f"{slower} takes longer. Each roof is a limit the operation cannot beat, so "
                   "the least time is the larger of the two times")
            expect(not close(flops / want), f"{shown}: {seconds:.3g} is the attainable rate in "
                   "FLOP/s; return the seconds (flops divided by that rate)")
            expect(False, f"{call} returned {got_s}, expected max(flops / peak_flops, "
                          f"nbytes / mem_bytes_per_s) = {want_s}")
        intensity, balance = flops / nbytes, peak / bw
        expect(bound == want_bound, f"{call} returned the bound {got[1]!r}: the intensity "
               f"flops / nbytes = {intensity:.3g} FLOP/B lies "
               f"{'left' if want_bound == 'memory' else 'right'} of this machine's balance "
               f"point peak_flops / mem_bytes_per_s = {balance:.3g} FLOP/B, so it is "
               f"{want_bound}-bound: its {want_bound} roof sets the least time")


# ---- gpus: which physical GPU is cuda:i, and how is it linked ---------------------------------
@check("link_between", observes=[
    "the link returned for cuda:i and cuda:j on fresh topologies and CUDA_VISIBLE_DEVICES "
    "values (unset, empty, reordered, shortened, spaced, with an invalid entry, with a "
    "repeated index), "
    "against the physical GPUs "
    "CUDA makes visible; asking for a GPU that is not visible must raise"])
def check_link_between(fn):
    """fn(topo, visible, i, j): the link `nvidia-smi topo -m` shows between the GPUs PyTorch
    calls cuda:i and cuda:j, when CUDA_VISIBLE_DEVICES is `visible` (None: not set)."""
    g = fresh_generator()
    for _ in range(3):
        n = randint(g, 4, 8)
        topo = topology(g, n)
        for spec in specs(g, n):
            shown = visible(spec, n)
            for _ in range(2 if shown else 0):
                i = randint(g, 0, len(shown) - 1)
                j = (i + randint(g, 1, len(shown) - 1)) % len(shown)
                call = f"link_between(topo, {spec!r}, {i}, {j})"
                try:
                    got = fn([row[:] for row in topo], spec, i, j)
                except (ValueError, IndexError, KeyError) as e:
                    spaced = (" (torch strips the spaces around each entry)"
                              if " " in (spec or "") else "")
                    raise CheckFailed(f"{call} raised {type(e).__name__}, but cuda:{i} and "
                                      f"cuda:{j} are visible: GPUs {shown}{spaced}") from None
                want = topo[shown[i]][shown[j]]
                if got == want:
                    continue
                hint = ""
                if got == topo[i][j]:
                    hint = (": nvidia-smi numbers the physical GPUs, PyTorch the visible ones; "
                            f"cuda:{i} is the physical GPU at position {i} of "
                            "CUDA_VISIBLE_DEVICES")
                expect(False, f"{call} returned {got!r}, expected {want!r} (cuda:{i} is GPU "
                              f"{shown[i]}, cuda:{j} is GPU {shown[j]}){hint}")
            if spec is not None and len(shown) < len(spec.split(",")):
                raises_beyond(fn, topo, spec, shown)
