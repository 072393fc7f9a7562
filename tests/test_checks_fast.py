"""The Part IV exercise checks (helpers/checks/profile.py, fixes.py, scaling.py; check_time_it
in tests/test_checks_time_it.py): the notebooks' worked answers pass, shortcuts of different kinds
fail naming what they skipped, other right answers pass (tests/check_cases.py)."""
import fractions

import numpy as np
import torch
from check_cases import other, parametrize_cases, shortcut, worked

import helpers
from helpers import unflatten_into
from helpers.checks import check_ring_allreduce


# ---- profile: time_shares --------------------------------------------------------------------
@worked("check_time_shares")
def time_shares(seconds):
    total = sum(seconds.values())
    order = sorted(seconds.items(), key=lambda kv: -kv[1])
    return {k: v / total for k, v in order}


@other("check_time_shares", "numpy shares, keys sorted by value")
def time_shares_numpy(seconds):
    names = sorted(seconds, key=seconds.get, reverse=True)
    values = np.array([seconds[n] for n in names])
    return dict(zip(names, values / values.sum()))


@shortcut("check_time_shares", "not sorted", "largest share first")
def time_shares_unsorted(seconds):
    return {k: v / sum(seconds.values()) for k, v in seconds.items()}


@shortcut("check_time_shares", "seconds, not shares", "divide by the total")
def time_shares_seconds(seconds):
    return dict(sorted(seconds.items(), key=lambda kv: -kv[1]))


@shortcut("check_time_shares", "percentages", "percentage")
def time_shares_percent(seconds):
    return {k: 100 * v for k, v in time_shares(seconds).items()}


# ---- profile: predicted_speedup --------------------------------------------------------------
@worked("check_predicted_speedup")
def predicted_speedup(compute_s, comm_s, k):
    if k == 1:
        return 1.0
    return compute_s / (compute_s / k + comm_s)


@other("check_predicted_speedup", "k times the compute share, numpy")
def predicted_speedup_share(compute_s, comm_s, k):
    comm = 0.0 if k == 1 else comm_s
    return np.float64(k) * compute_s / (compute_s + k * comm)


@shortcut("check_predicted_speedup", "the ideal k", "ideal k")
def predicted_speedup_ideal(compute_s, comm_s, k):
    return float(k)


@shortcut("check_predicted_speedup", "compute not split", "never splits the compute")
def predicted_speedup_unsplit(compute_s, comm_s, k):
    return 1.0 if k == 1 else compute_s / (compute_s + comm_s)


@shortcut("check_predicted_speedup", "one worker communicates too", "over itself is 1")
def predicted_speedup_k1(compute_s, comm_s, k):
    return compute_s / (compute_s / k + comm_s)


# ---- fixes: bucket_allreduce -----------------------------------------------------------------
@worked("check_bucket_allreduce")
def bucket_allreduce(grads, bucket_bytes):
    bucket, size = [], 0
    for i, g in enumerate(grads[0]):
        bucket.append(i)
        size += g.numel() * g.element_size()
        if size >= bucket_bytes or i == len(grads[0]) - 1:
            flats = [torch.cat([g[j].reshape(-1) for j in bucket])
                     for g in grads]
            for f in flats[1:]:
                flats[0] += f.to(flats[0].device)
            for g in grads:
                unflatten_into(flats[0].to(g[0].device),
                               [g[j] for j in bucket])
            bucket, size = [], 0


@other("check_bucket_allreduce", "buckets first, flat_allreduce per bucket")
def bucket_allreduce_flat(grads, bucket_bytes):
    buckets, cur, size = [], [], 0
    for i, g in enumerate(grads[0]):
        cur.append(i)
        size += g.nbytes
        if size >= bucket_bytes:
            buckets.append(cur)
            cur, size = [], 0
    for idx in buckets + ([cur] if cur else []):
        helpers.flat_allreduce([[g[i] for i in idx] for g in grads])


@other("check_bucket_allreduce", "sum on every device, slices copied back")
def bucket_allreduce_everywhere(grads, bucket_bytes):
    start = 0
    while start < len(grads[0]):
        end, size = start, 0
        while end < len(grads[0]) and size < bucket_bytes:
            size += grads[0][end].numel() * grads[0][end].element_size()
            end += 1
        flats = [torch.cat([t.flatten() for t in g[start:end]]) for g in grads]
        for g, mine in zip(grads, flats):
            total = sum(f.to(mine.device) for f in flats)
            offset = 0
            for t in g[start:end]:
                t.copy_(total[offset:offset + t.numel()].view_as(t))
                offset += t.numel()
        start = end


@shortcut("check_bucket_allreduce", "one buffer for all tensors", "one buffer of all")
def bucket_allreduce_one_flat(grads, bucket_bytes):
    helpers.flat_allreduce(grads)


@shortcut("check_bucket_allreduce", "each tensor on its own", "single tensors")
def bucket_allreduce_per_tensor(grads, bucket_bytes):
    for i in range(len(grads[0])):
        helpers.allreduce([g[i] for g in grads])


@shortcut("check_bucket_allreduce", "counts elements, not bytes", "numel * element_size")
def bucket_allreduce_elements(grads, bucket_bytes):
    bucket, size = [], 0
    for i, g in enumerate(grads[0]):
        bucket.append(i)
        size += g.numel()
        if size >= bucket_bytes or i == len(grads[0]) - 1:
            helpers.flat_allreduce([[r[j] for j in bucket] for r in grads])
            bucket, size = [], 0


@shortcut("check_bucket_allreduce", "closes a bucket only past bucket_bytes", "at least")
def bucket_allreduce_past(grads, bucket_bytes):
    bucket, size = [], 0
    for i, g in enumerate(grads[0]):
        bucket.append(i)
        size += g.numel() * g.element_size()
        if size > bucket_bytes or i == len(grads[0]) - 1:
            helpers.flat_allreduce([[r[j] for j in bucket] for r in grads])
            bucket, size = [], 0


@shortcut("check_bucket_allreduce", "rebinds the list items", "INTO the given tensors")
def bucket_allreduce_rebinding(grads, bucket_bytes):
    for i in range(len(grads[0])):
        s = sum(g[i] for g in grads)
        for g in grads:
            g[i] = s.clone()


@shortcut("check_bucket_allreduce", "the reference", "course's own answer")
def bucket_allreduce_reference(grads, bucket_bytes):
    helpers.bucketed_allreduce(grads, bucket_bytes)


def _bucket_indices(grads, bucket_bytes):
    """The right buckets: consecutive tensors, each closed once it holds >= bucket_bytes."""
    out, cur, size = [], [], 0
    for i, g in enumerate(grads[0]):
        cur.append(i)
        size += g.numel() * g.element_size()
        if size >= bucket_bytes or i == len(grads[0]) - 1:
            out.append(cur)
            cur, size = [], 0
    return out


@other("check_bucket_allreduce", "a ring allreduce of each bucket's flat buffers (DDP on NCCL)")
def bucket_allreduce_ring(grads, bucket_bytes):
    for b in _bucket_indices(grads, bucket_bytes):
        flats = [torch.cat([r[j].reshape(-1) for j in b]) for r in grads]
        helpers.ring_allreduce(flats)
        for f, r in zip(flats, grads, strict=True):
            unflatten_into(f, [r[j] for j in b])


@other("check_bucket_allreduce", "each bucket summed on the host, the sum copied back")
def bucket_allreduce_host_sum(grads, bucket_bytes):
    for b in _bucket_indices(grads, bucket_bytes):
        total = sum(torch.cat([r[j].reshape(-1) for j in b]).cpu() for r in grads)
        for r in grads:
            unflatten_into(total.to(r[0].device), [r[j] for j in b])


@shortcut("check_bucket_allreduce", "a buffer reaching into the next bucket", "parts of 2 buckets")
def bucket_allreduce_reaching(grads, bucket_bytes):
    buckets = _bucket_indices(grads, bucket_bytes)
    buckets[:2] = [buckets[0] + buckets[1][:1], buckets[1][1:]]   # values still summed right
    for b in buckets:
        flats = [torch.cat([r[j].reshape(-1) for j in b]) for r in grads]
        helpers.ring_allreduce(flats)
        for f, r in zip(flats, grads, strict=True):
            unflatten_into(f, [r[j] for j in b])


@shortcut("check_bucket_allreduce", "a bucket's tensors moved one by one", "single tensors")
def bucket_allreduce_one_by_one(grads, bucket_bytes):
    dev = grads[0][0].device
    for b in _bucket_indices(grads, bucket_bytes):
        total = sum(torch.cat([r[j].reshape(-1).to(dev) for j in b]) for r in grads)
        for r in grads:
            unflatten_into(total.to(r[0].device), [r[j] for j in b])


@other("check_bucket_allreduce", "one scratch buffer per device, reused bucket after bucket")
def bucket_allreduce_scratch(grads, bucket_bytes):
    bufs = [torch.empty(sum(t.numel() for t in r), dtype=r[0].dtype, device=r[0].device)
            for r in grads]
    for b in _bucket_indices(grads, bucket_bytes):
        n = sum(grads[0][j].numel() for j in b)
        for buf, r in zip(bufs, grads, strict=True):
            buf[:n].copy_(torch.cat([r[j].reshape(-1) for j in b]))
        for buf in bufs[1:]:
            bufs[0][:n] += buf[:n].to(bufs[0].device)
        for r in grads:
            unflatten_into(bufs[0][:n].to(r[0].device), [r[j] for j in b])


@shortcut("check_bucket_allreduce", "a reused buffer sent whole, past the bucket's end",
          "parts of 2 buckets")
def bucket_allreduce_scratch_sent_whole(grads, bucket_bytes):
    bufs = [torch.zeros(sum(t.numel() for t in r), dtype=r[0].dtype, device=r[0].device)
            for r in grads]
    for b in _bucket_indices(grads, bucket_bytes):
        n = sum(grads[0][j].numel() for j in b)
        for buf, r in zip(bufs, grads, strict=True):
            buf[:n].copy_(torch.cat([r[j].reshape(-1) for j in b]))
        for buf in bufs[1:]:
            bufs[0] += buf.to(bufs[0].device)       # the stale tail of earlier buckets too
        for r in grads:
            unflatten_into(bufs[0][:n].to(r[0].device), [r[j] for j in b])


# ---- fixes: ring_allreduce -------------------------------------------------------------------
@worked("check_ring_allreduce")
def my_ring_allreduce(data):
    k = len(data)
    chunks = [list(t.view(-1).tensor_split(k)) for t in data]
    sent = [0] * k
    for phase in ("reduce-scatter", "all-gather"):
        for s in range(k - 1):
            for i in range(k):
                dst = (i + 1) % k
                c = ((i - s) % k if phase == "reduce-scatter"
                     else (i + 1 - s) % k)
                if phase == "reduce-scatter":
                    chunks[dst][c].add_(chunks[i][c].to(data[dst].device))
                else:
                    chunks[dst][c].copy_(chunks[i][c])
                sent[i] += chunks[i][c].numel()
    return sent


@other("check_ring_allreduce", "the other way round the ring, numpy counts")
def ring_allreduce_backwards(data):
    k = len(data)
    chunks = [t.view(-1).tensor_split(k) for t in data]
    sent = np.zeros(k, dtype=np.int64)
    for s in range(k - 1):                         # reduce-scatter, to the left
        for i in range(k):
            c, dst = (i + s) % k, (i - 1) % k
            chunks[dst][c].add_(chunks[i][c].to(data[dst].device))
            sent[i] += chunks[i][c].numel()
    for s in range(k - 1):                         # all-gather, to the left
        for i in range(k):
            c, dst = (i + s - 1) % k, (i - 1) % k
            chunks[dst][c].copy_(chunks[i][c])
            sent[i] += chunks[i][c].numel()
    return list(sent)


@shortcut("check_ring_allreduce", "naive sum, made-up counts", "the whole tensor")
def ring_allreduce_naive(data):
    helpers.allreduce(data)
    k, n = len(data), data[0].numel()
    return [sum(len(c) for j, c in enumerate(torch.arange(n).tensor_split(k)) if j != i)
            for i in range(k)]


@shortcut("check_ring_allreduce", "chunks through device 0", "in a ring each device")
def ring_allreduce_star(data):
    k = len(data)
    chunks = [t.view(-1).tensor_split(k) for t in data]
    sent = [0] * k
    for c in range(k):
        for i in range(1, k):
            chunks[0][c].add_(chunks[i][c].to(data[0].device))
            sent[i] += chunks[i][c].numel()
        for i in range(1, k):
            chunks[i][c].copy_(chunks[0][c])
            sent[0] += chunks[0][c].numel()
    return sent


@shortcut("check_ring_allreduce", "no all-gather", "does not hold the sum")
def ring_allreduce_no_allgather(data):
    k = len(data)
    chunks = [list(t.view(-1).tensor_split(k)) for t in data]
    for s in range(k - 1):
        for i in range(k):
            c, dst = (i - s) % k, (i + 1) % k
            chunks[dst][c].add_(chunks[i][c])
    return [2 * (k - 1) * c[0].numel() for c in chunks]


@shortcut("check_ring_allreduce", "counts what it received", "you report device")
def ring_allreduce_miscounted(data):
    sent = my_ring_allreduce(data)
    return sent[1:] + sent[:1]                    # device i+1's count for device i


@shortcut("check_ring_allreduce", "the reference", "course's own answer")
def ring_allreduce_reference(data):
    return helpers.ring_allreduce(data)


def test_ring_counts_are_observed_not_trusted():
    """Made-up counts (the formula's 2(k-1)/k n each) on a naive sum still fail."""
    def naive(data):
        helpers.allreduce(data)
        k, n = len(data), data[0].numel()
        return [2 * (k - 1) * n // k + (i < 2 * (k - 1) * n % k) for i in range(k)]
    result = check_ring_allreduce(naive)
    assert result.status == "failed" and "sent" in result.message, result


# ---- fixes: amdahl_speedup -------------------------------------------------------------------
@worked("check_amdahl_speedup")
def amdahl_speedup(shares, factors):
    return 1 / sum(s / factors.get(name, 1.0) for name, s in shares.items())


@other("check_amdahl_speedup", "the time saved, in fractions")
def amdahl_speedup_saved(shares, factors):
    saved = sum(fractions.Fraction(shares[n]) * (1 - 1 / fractions.Fraction(f))
                for n, f in factors.items())
    return 1 / (1 - saved)


@shortcut("check_amdahl_speedup", "averages the speeds", "sum of share / factor")
def amdahl_speedup_speeds(shares, factors):
    return sum(s * factors.get(n, 1.0) for n, s in shares.items())


@shortcut("check_amdahl_speedup", "forgets the phases not fixed", "still take their share")
def amdahl_speedup_fixed_only(shares, factors):
    return 1 / sum(shares[n] / f for n, f in factors.items()) if factors else 1.0


@shortcut("check_amdahl_speedup", "adds the factors", "expected")
def amdahl_speedup_sum(shares, factors):
    return sum(factors.values()) or 1.0


# ---- scaling: fit_latency_bandwidth ----------------------------------------------------------
@worked("check_fit_latency_bandwidth")
def fit_latency_bandwidth(n_bytes, seconds):
    A = torch.tensor([[1.0, float(n)] for n in n_bytes], dtype=torch.float64)
    t = torch.tensor(seconds, dtype=torch.float64).unsqueeze(1)
    alpha, slope = torch.linalg.lstsq(A, t).solution.squeeze(1).tolist()
    return alpha, 1 / slope


@other("check_fit_latency_bandwidth", "numpy.polyfit, numpy numbers")
def fit_polyfit(n_bytes, seconds):
    slope, alpha = np.polyfit(np.asarray(n_bytes, dtype=float), seconds, 1)
    return alpha, 1 / slope


@other("check_fit_latency_bandwidth", "relative residuals, as the course's fit")
def fit_relative(n_bytes, seconds):
    t = torch.tensor(seconds, dtype=torch.float64)
    A = torch.stack([torch.ones_like(t), torch.tensor(n_bytes, dtype=torch.float64)], 1)
    sol = torch.linalg.lstsq(A / t[:, None], torch.ones_like(t)[:, None]).solution
    alpha, slope = sol.squeeze(1).tolist()
    return alpha, 1 / slope


@shortcut("check_fit_latency_bandwidth", "a line through the first and last point",
          "through the first and last point")
def fit_two_points(n_bytes, seconds):
    slope = (seconds[-1] - seconds[0]) / (n_bytes[-1] - n_bytes[0])
    return seconds[0] - slope * n_bytes[0], 1 / slope


@shortcut("check_fit_latency_bandwidth", "the slope, not the bandwidth", "inverse of the slope")
def fit_slope(n_bytes, seconds):
    alpha, beta = fit_latency_bandwidth(n_bytes, seconds)
    return alpha, 1 / beta


@shortcut("check_fit_latency_bandwidth", "no latency", "intercept")
def fit_no_latency(n_bytes, seconds):
    return 0.0, sum(n_bytes) / sum(seconds)


@shortcut("check_fit_latency_bandwidth", "the reference", "course's own answer")
def fit_reference(n_bytes, seconds):
    return helpers.fit_alpha_beta(n_bytes, seconds)


# ---- scaling: ring_allreduce_seconds ---------------------------------------------------------
@worked("check_ring_allreduce_seconds")
def ring_allreduce_time(n_bytes, k, alpha, beta):
    if k <= 1:
        return 0.0
    return 2 * (k - 1) * alpha + 2 * (k - 1) / k * n_bytes / beta


@other("check_ring_allreduce_seconds", "per step, numpy")
def ring_allreduce_time_steps(n_bytes, k, alpha, beta):
    steps = np.float64(2 * (k - 1))
    return steps * (alpha + n_bytes / k / beta)


@shortcut("check_ring_allreduce_seconds", "the naive allreduce", "naive allreduce")
def ring_allreduce_time_naive(n_bytes, k, alpha, beta):
    return 2 * (k - 1) * (alpha + n_bytes / beta)


@shortcut("check_ring_allreduce_seconds", "the whole tensor per device", "2(k-1)/k of the n")
def ring_allreduce_time_whole(n_bytes, k, alpha, beta):
    return 2 * (k - 1) * alpha + (n_bytes / beta if k > 1 else 0.0)


@shortcut("check_ring_allreduce_seconds", "one phase only", "both phases")
def ring_allreduce_time_half(n_bytes, k, alpha, beta):
    return (k - 1) * alpha + (k - 1) / k * n_bytes / beta


@shortcut("check_ring_allreduce_seconds", "the reference", "course's own answer")
def ring_allreduce_time_reference(n_bytes, k, alpha, beta):
    return helpers.allreduce_time(n_bytes, k, alpha, beta)


@shortcut("check_ring_allreduce_seconds", "the course's byte count", "course's own answer")
def ring_allreduce_time_bytes(n_bytes, k, alpha, beta):
    return 2 * (k - 1) * alpha + helpers.ring_bytes_per_device(n_bytes, k) / beta


# ---- scaling: crossover_bytes ----------------------------------------------------------------
@worked("check_crossover_bytes")
def crossover_bytes(alpha, beta):
    return alpha * beta


@other("check_crossover_bytes", "alpha over the time of a byte, a 0-d tensor")
def crossover_bytes_tensor(alpha, beta):
    return torch.tensor(alpha, dtype=torch.float64) / (1 / torch.tensor(beta,
                                                                        dtype=torch.float64))


@shortcut("check_crossover_bytes", "alpha / beta", "set it equal to alpha")
def crossover_bytes_ratio(alpha, beta):
    return alpha / beta


@shortcut("check_crossover_bytes", "beta / alpha", "n / beta")
def crossover_bytes_inverse(alpha, beta):
    return beta / alpha


test_case = parametrize_cases(__name__)


def test_checks_are_exported():
    for module in (helpers.checks.profile, helpers.checks.fixes, helpers.checks.scaling):
        for name in module.__all__:
            assert getattr(helpers.checks, name) is getattr(module, name)
