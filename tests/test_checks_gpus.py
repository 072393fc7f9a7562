"""The checks of the foundation chapter's exercises (helpers/checks/gpus.py): worked answers,
shortcuts of different kinds (each failing with the message that names what it skipped), other
right answers (tests/check_cases.py)."""
import numpy as np
import torch
from check_cases import other, parametrize_cases, shortcut, worked


# ---- matmul_flops ------------------------------------------------------------------------------
@worked("check_matmul_flops")
def matmul_flops(n):
    return 2 * n**3


@shortcut("check_matmul_flops", "forgets the additions", "two operations, a multiply and an add")
def matmul_flops_multiplies_only(n):
    return n**3


@shortcut("check_matmul_flops", "counts outputs, not their sums", "needs n multiplies and n adds")
def matmul_flops_outputs(n):
    return 2 * n**2


@shortcut("check_matmul_flops", "a constant", "expected 2·n³")
def matmul_flops_constant(n):
    return 2 * 512**3


@other("check_matmul_flops", "numpy float32, summed per output")
def matmul_flops_numpy(n):
    return np.float32(n * n) * np.float32(2 * n)


@other("check_matmul_flops", "float")
def matmul_flops_float(n):
    return float(n) ** 3 * 2


# ---- tensor_bytes ------------------------------------------------------------------------------
@worked("check_tensor_bytes")
def tensor_bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


@shortcut("check_tensor_bytes", "counts elements", "the number of elements")
def tensor_bytes_numel(tensors):
    return sum(t.numel() for t in tensors)


@shortcut("check_tensor_bytes", "one size for every dtype", "as if every element took 4 bytes")
def tensor_bytes_float32(tensors):
    return 4 * sum(t.numel() for t in tensors)


@other("check_tensor_bytes", "nbytes")
def tensor_bytes_nbytes(tensors):
    return sum(t.nbytes for t in tensors)


@shortcut("check_tensor_bytes", "storage bytes, a tensor (a view's storage is its base's)",
          "the bytes of their storages")
def tensor_bytes_storage(tensors):
    return torch.tensor([t.untyped_storage().nbytes() for t in tensors]).sum()


# ---- copy_time ---------------------------------------------------------------------------------
@worked("check_copy_time")
def copy_time(num_bytes, bandwidth_gbs, latency_s):
    return latency_s + num_bytes / (bandwidth_gbs * 1e9)


@shortcut("check_copy_time", "no latency", "the latency term is missing")
def copy_time_bandwidth_only(num_bytes, bandwidth_gbs, latency_s):
    return num_bytes / (bandwidth_gbs * 1e9)


@shortcut("check_copy_time", "wrong unit", "a GB here is 1e9 bytes")
def copy_time_gib(num_bytes, bandwidth_gbs, latency_s):
    return latency_s + num_bytes / (bandwidth_gbs * 2**30)


@shortcut("check_copy_time", "no unit", "multiply it by 1e9")
def copy_time_no_giga(num_bytes, bandwidth_gbs, latency_s):
    return latency_s + num_bytes / bandwidth_gbs


@other("check_copy_time", "in another order, numpy")
def copy_time_numpy(num_bytes, bandwidth_gbs, latency_s):
    return np.float64(num_bytes) / bandwidth_gbs / 1e9 + latency_s


# ---- fit_copy_model ----------------------------------------------------------------------------
@worked("check_fit_copy_model")
def fit_copy_model(nbytes, seconds):
    t = torch.tensor(seconds, dtype=torch.float64)
    b = torch.tensor(nbytes, dtype=torch.float64)
    A = torch.stack([torch.ones_like(b), b], dim=1) / t[:, None]  # weigh 1/t
    sol = torch.linalg.lstsq(A, torch.ones(len(t), 1, dtype=torch.float64))
    alpha, slope = sol.solution.squeeze(1).tolist()
    return alpha, 1 / slope / 1e9


@shortcut("check_fit_copy_model", "unweighted fit", "weighed by 1/t")
def fit_copy_model_unweighted(nbytes, seconds):
    b = torch.tensor(nbytes, dtype=torch.float64)
    A = torch.stack([torch.ones_like(b), b], dim=1)
    sol = torch.linalg.lstsq(A, torch.tensor(seconds, dtype=torch.float64)[:, None])
    alpha, slope = sol.solution.squeeze(1).tolist()
    return alpha, 1 / slope / 1e9


@shortcut("check_fit_copy_model", "the weighted fit in float32", "solved in float32")
def fit_copy_model_float32(nbytes, seconds):
    t = torch.tensor(seconds)                   # torch's default dtype: float32
    b = torch.tensor(nbytes, dtype=torch.float32)
    A = torch.stack([torch.ones_like(b), b], dim=1) / t[:, None]
    alpha, slope = torch.linalg.lstsq(A, (t / t)[:, None]).solution.squeeze(1).tolist()
    return alpha, 1 / slope / 1e9


@shortcut("check_fit_copy_model", "no fit: two points", "reading two points")
def fit_copy_model_two_points(nbytes, seconds):
    slope = (seconds[-1] - seconds[-2]) / (nbytes[-1] - nbytes[-2])
    return seconds[0], 1 / slope / 1e9


@shortcut("check_fit_copy_model", "no fit: the end points", "misses the measurements")
def fit_copy_model_end_points(nbytes, seconds):
    slope = (seconds[-1] - seconds[0]) / (nbytes[-1] - nbytes[0])
    return seconds[0] - slope * nbytes[0], 1 / slope / 1e9


@shortcut("check_fit_copy_model", "wrong unit", "looks like bytes/s")
def fit_copy_model_bytes_per_second(nbytes, seconds):
    alpha, gbs = fit_copy_model(nbytes, seconds)
    return alpha, gbs * 1e9


@other("check_fit_copy_model", "numpy polyfit with weights, numpy scalars")
def fit_copy_model_polyfit(nbytes, seconds):
    t = np.asarray(seconds)
    slope, alpha = np.polyfit(np.asarray(nbytes, float), t, 1, w=1 / t)
    return alpha, 1 / slope / 1e9


@other("check_fit_copy_model", "normal equations by hand")
def fit_copy_model_normal_equations(nbytes, seconds):
    rows = [(1 / t, b / t) for b, t in zip(nbytes, seconds)]
    s11 = sum(a * a for a, _ in rows)
    s12 = sum(a * c for a, c in rows)
    s22 = sum(c * c for _, c in rows)
    r1, r2 = sum(a for a, _ in rows), sum(c for _, c in rows)
    det = s11 * s22 - s12 * s12
    alpha, slope = (r1 * s22 - r2 * s12) / det, (s11 * r2 - s12 * r1) / det
    return [alpha, 1 / slope / 1e9]


# ---- roofline_time -----------------------------------------------------------------------------
@worked("check_roofline_time")
def roofline_time(flops, nbytes, peak_flops, mem_bytes_per_s):
    compute_s, memory_s = flops / peak_flops, nbytes / mem_bytes_per_s
    if memory_s > compute_s:
        return memory_s, "memory"
    return compute_s, "compute"


@shortcut("check_roofline_time", "adds the two times", "not their sum")
def roofline_time_sum(flops, nbytes, peak_flops, mem_bytes_per_s):
    compute_s, memory_s = flops / peak_flops, nbytes / mem_bytes_per_s
    return compute_s + memory_s, "memory" if memory_s > compute_s else "compute"


@shortcut("check_roofline_time", "counts the arithmetic only", "takes longer")
def roofline_time_compute_only(flops, nbytes, peak_flops, mem_bytes_per_s):
    return flops / peak_flops, "compute"


@shortcut("check_roofline_time", "one GPU's balance point for every machine",
          ["balance point peak_flops / mem_bytes_per_s", "-bound"])
def roofline_time_fixed_balance(flops, nbytes, peak_flops, mem_bytes_per_s):
    seconds = max(flops / peak_flops, nbytes / mem_bytes_per_s)
    return seconds, "memory" if flops / nbytes < 12 else "compute"     # an H200's, float32


@shortcut("check_roofline_time", "returns the rate", "attainable rate in FLOP/s")
def roofline_time_rate(flops, nbytes, peak_flops, mem_bytes_per_s):
    rate = min(peak_flops, flops / nbytes * mem_bytes_per_s)
    return rate, "memory" if rate < peak_flops else "compute"


@other("check_roofline_time", "through the attainable rate, numpy, '-bound' words, a list")
def roofline_time_attainable(flops, nbytes, peak_flops, mem_bytes_per_s):
    intensity = np.float64(flops) / nbytes
    rate = min(peak_flops, intensity * mem_bytes_per_s)
    return [flops / rate, "Memory-bound" if intensity < peak_flops / mem_bytes_per_s
            else "compute-bound"]


# ---- link_between: CUDA_VISIBLE_DEVICES empty, or spaced after the commas -----------------------
def _visible_after(read, topo):
    """The worked answer's ending: none for a repeat, counted up to a GPU that is missing."""
    gpus = [] if len(set(read)) < len(read) else read
    return gpus[:next((k for k, g in enumerate(gpus) if g >= len(topo)), len(gpus))]


@shortcut("check_link_between", "an empty CUDA_VISIBLE_DEVICES read as unset (`if not visible`)",
          "empty string hides every GPU")
def link_between_empty_as_unset(topo, visible, i, j):
    read = []
    for entry in visible.split(",") if visible else []:
        if not entry.strip().isdigit():
            break
        read.append(int(entry))
    gpus = _visible_after(read, topo) if visible else list(range(len(topo)))
    if max(i, j) >= len(gpus):
        raise ValueError(f"only {len(gpus)} GPUs are visible")
    return topo[gpus[i]][gpus[j]]


@shortcut("check_link_between", "entries not stripped (' 1'.isdigit() is False)",
          "strips the spaces")
def link_between_no_strip(topo, visible, i, j):
    read = []
    for entry in [] if visible is None else visible.split(","):
        if not entry.isdigit():
            break
        read.append(int(entry))
    gpus = list(range(len(topo))) if visible is None else _visible_after(read, topo)
    if max(i, j) >= len(gpus):
        raise ValueError(f"only {len(gpus)} GPUs are visible")
    return topo[gpus[i]][gpus[j]]


test_case = parametrize_cases(__name__)


def test_inputs_are_fresh():
    """Two runs of a check use different inputs, so an answer cannot memorise them."""
    from helpers.checks import check_copy_time
    runs = []
    for _ in range(2):
        seen = []
        check_copy_time(lambda *args, seen=seen: (seen.append(repr(args)), copy_time(*args))[1])
        runs.append(seen)
    assert runs[0] and runs[0] != runs[1]
