"""The checks of Part IV's fixes chapter (helpers/checks/fixes.py): the notebook's worked answers
pass, shortcuts of different kinds fail naming what they skipped, other right answers pass
(tests/check_cases.py); a ring's counts are observed, not trusted."""
import fractions

import numpy as np
import torch
from check_cases import other, parametrize_cases, shortcut, worked

import helpers
from helpers import unflatten_into
from helpers.checks import check_ring_allreduce


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


@shortcut("check_bucket_allreduce", "a flat buffer made in float32 (torch.zeros' default dtype)",
          "in float64")
def bucket_allreduce_zeros_buffer(grads, bucket_bytes):
    for b in _bucket_indices(grads, bucket_bytes):
        n = sum(grads[0][j].numel() for j in b)
        flats = []
        for r in grads:
            f, o = torch.zeros(n, device=r[0].device), 0
            for j in b:
                f[o:o + r[j].numel()] = r[j].reshape(-1)
                o += r[j].numel()
            flats.append(f)
        for f in flats[1:]:
            flats[0] += f.to(flats[0].device)
        for r in grads:
            unflatten_into(flats[0].to(r[0].device, r[0].dtype), [r[j] for j in b])


@shortcut("check_bucket_allreduce", "each bucket flattened through .float()", "in float64")
def bucket_allreduce_float_buffer(grads, bucket_bytes):
    for b in _bucket_indices(grads, bucket_bytes):
        flats = [torch.cat([r[j].reshape(-1).float() for j in b]) for r in grads]
        for f in flats[1:]:
            flats[0] += f.to(flats[0].device)
        for r in grads:
            unflatten_into(flats[0].to(r[0].device, r[0].dtype), [r[j] for j in b])


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
          [("parts of 2 buckets",    # or, where its first bucket's buffer holds every tensor
            "one buffer of all")])
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


test_case = parametrize_cases(__name__)
