"""Checks for the exercises of the foundation chapter (gpus): counting work, bytes and copy time."""
import math

import torch

from ._core import as_number, expect, fresh_generator, randint, run_check

__all__ = ["check_matmul_flops", "check_tensor_bytes", "check_copy_time"]


def _close(a, b, rel=1e-6):
    return math.isclose(a, b, rel_tol=rel, abs_tol=0.0)


# ---------------------------------------------------------------------------------------------
def check_matmul_flops(fn):
    """fn(n) returns the floating-point operations of an n×n by n×n matrix product: 2·n³."""

    def body(fn):
        g = fresh_generator()
        ns = {randint(g, 2, 40), randint(g, 41, 600), randint(g, 601, 8192)}
        seen = {}
        for n in sorted(ns):
            got = as_number(fn(n), f"matmul_flops({n})")
            want = 2 * n**3
            seen[n] = got
            if _close(got, n**3):
                expect(False, f"matmul_flops({n}) returned n³ = {n**3}: each of the n³ "
                              "multiply-adds is two operations, a multiply and an add")
            if _close(got, 2 * n**2):
                expect(False, f"matmul_flops({n}) returned 2·n² = {2 * n**2}: each of the n² "
                              "output entries needs n multiplies and n adds")
            expect(_close(got, want),
                   f"matmul_flops({n}) returned {got:g}, expected 2·n³ = {want}")
        expect(len(set(seen.values())) == len(seen),
               f"matmul_flops returned the same value for different n: {seen}")

    return run_check("matmul_flops", body, fn)


# ---------------------------------------------------------------------------------------------
_DTYPES = [torch.float32, torch.float16, torch.int64, torch.bool]


def _random_tensors(g, count):
    tensors = []
    for _ in range(count):
        dtype = _DTYPES[randint(g, 0, len(_DTYPES) - 1)]
        shape = tuple(randint(g, 1, 9) for _ in range(randint(g, 1, 3)))
        tensors.append(torch.zeros(shape, dtype=dtype))
    return tensors


def check_tensor_bytes(fn):
    """fn(tensors) returns the total bytes a list of tensors occupies (numel × element_size)."""

    def describe(ts):
        return "[" + ", ".join(f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"
                               for t in ts) + "]"

    def body(fn):
        g = fresh_generator()
        trials = [_random_tensors(g, randint(g, 1, 5)) for _ in range(6)]
        # at least one list mixing every dtype, so a fixed bytes-per-element cannot pass
        mixed = _random_tensors(g, 4)
        trials.append([t.to(dtype) for t, dtype in zip(mixed, _DTYPES)])
        for tensors in trials:
            want = sum(t.numel() * t.element_size() for t in tensors)
            got = as_number(fn(list(tensors)), f"tensor_bytes({describe(tensors)})")
            if got == want:
                continue
            numel = sum(t.numel() for t in tensors)
            expect(got != numel, f"for {describe(tensors)} you returned {got:g}, the number of "
                                 f"elements; the tensors occupy {want} bytes: multiply each "
                                 "tensor's numel() by its element_size()")
            for size in (2, 4, 8):
                expect(got != size * numel,
                       f"for {describe(tensors)} you returned {got:g}, as if every element took "
                       f"{size} bytes; expected {want}: float32 takes 4, float16 2, int64 8 and "
                       "bool 1 byte (element_size())")
            expect(False, f"for {describe(tensors)} you returned {got:g}, expected {want} bytes "
                          "(sum of numel() × element_size())")

    return run_check("tensor_bytes", body, fn)


# ---------------------------------------------------------------------------------------------
def check_copy_time(fn):
    """fn(num_bytes, bandwidth_gbs, latency_s) returns latency_s + num_bytes / (bandwidth_gbs·1e9),
    the alpha-beta model of a copy."""

    def body(fn):
        g = fresh_generator()
        results = set()
        for _ in range(6):
            bandwidth_gbs = randint(g, 5, 900) / 2          # GB/s: PCIe to NVLink
            latency_s = randint(g, 1, 500) * 1e-7            # 0.1 µs to 50 µs
            # a size where both terms matter, so a missing one is far off
            ratio = randint(g, 20, 500) / 100
            num_bytes = max(1, round(latency_s * bandwidth_gbs * 1e9 * ratio))
            transfer = num_bytes / (bandwidth_gbs * 1e9)
            want = latency_s + transfer
            call = f"copy_time({num_bytes}, {bandwidth_gbs}, {latency_s:.2e})"
            got = as_number(fn(num_bytes, bandwidth_gbs, latency_s), call)
            results.add(got)
            if _close(got, want):
                continue
            expect(not _close(got, transfer),
                   f"{call} returned {got:.3e} s, expected {want:.3e} s: the latency term is "
                   "missing (every copy pays latency_s before the first byte arrives)")
            expect(not _close(got, latency_s),
                   f"{call} returned {got:.3e} s, expected {want:.3e} s: the bandwidth term "
                   "num_bytes / (bandwidth_gbs·1e9) is missing")
            expect(not _close(got, latency_s + num_bytes / bandwidth_gbs),
                   f"{call} returned {got:.3e} s, expected {want:.3e} s: bandwidth_gbs is in GB/s, "
                   "multiply it by 1e9 to get bytes per second")
            expect(not _close(got, latency_s + num_bytes / (bandwidth_gbs * 2**30)),
                   f"{call} returned {got:.3e} s, expected {want:.3e} s: a GB here is 1e9 bytes, "
                   "not 2**30")
            expect(False, f"{call} returned {got:.3e} s, expected latency_s + "
                          f"num_bytes / (bandwidth_gbs·1e9) = {want:.3e} s")
        expect(len(results) > 1, "copy_time returned the same value for every input")
        # a zero-byte copy still pays the latency
        latency_s = randint(g, 1, 500) * 1e-7
        got = as_number(fn(0, 100.0, latency_s), f"copy_time(0, 100.0, {latency_s:.2e})")
        expect(_close(got, latency_s), f"copy_time(0, 100.0, {latency_s:.2e}) returned "
                                       f"{got:.3e} s: a copy of 0 bytes takes latency_s")

    return run_check("copy_time", body, fn)


# ---------------------------------------------------------------------------------------------
__all__ += ["check_fit_copy_model"]


def check_fit_copy_model(fn):
    """fn(nbytes, seconds) returns (latency_s, bandwidth_gbs) fitted to measured copy times
    t = latency_s + nbytes / (bandwidth_gbs·1e9). The check makes fresh measurements from a random
    latency and bandwidth (with 2% noise), so only a fit that uses them can pass."""

    def body(fn):
        g = fresh_generator()
        for _ in range(4):
            alpha = randint(g, 2, 50) * 1e-6                     # 2 to 50 µs
            gbs = randint(g, 10, 2000) / 10                      # 1 to 200 GB/s
            top = math.log10(300 * alpha * gbs * 1e9)            # the largest copy: 300x alpha
            nbytes = [round(10 ** (1.8 + (top - 1.8) * i / 11)) for i in range(12)]
            noise = 1 + 0.04 * (torch.rand(12, generator=g, dtype=torch.float64) - 0.5)
            seconds = [(alpha + b / (gbs * 1e9)) * float(e) for b, e in zip(nbytes, noise)]
            call = f"fit_copy_model on copies of {nbytes[0]} to {nbytes[-1]} bytes"
            got = fn(list(nbytes), list(seconds))
            expect(isinstance(got, (tuple, list)) and len(got) == 2,
                   f"{call} returned {got!r}: expected a pair (latency_s, bandwidth_gbs)")
            lat, bw = (as_number(v, call) for v in got)
            if not math.isclose(bw, gbs, rel_tol=0.15):
                expect(not math.isclose(bw, gbs * 1e9, rel_tol=0.15),
                       f"{call}: bandwidth {bw:.3g} looks like bytes/s: return GB/s "
                       "(divide by 1e9)")
                expect(not math.isclose(bw * gbs * 1e9, 1, rel_tol=0.15) and
                       not math.isclose(bw * gbs, 1, rel_tol=0.15),
                       f"{call}: {bw:.3g} is seconds per byte (the slope): the bandwidth is its "
                       "inverse")
                expect(False, f"{call}: bandwidth {bw:.3g} GB/s, but these copies were made at "
                              f"{gbs:g} GB/s: fit the slope of time against bytes on the large "
                              "copies")
            if not math.isclose(lat, alpha, rel_tol=0.3):
                expect(lat > 0.05 * alpha, f"{call}: latency {lat:.3g} s, but every copy here took "
                       f"at least {min(seconds):.3g} s: the smallest copies show the latency")
                expect(False, f"{call}: latency {lat:.3g} s, but these copies were made with "
                              f"{alpha:.3g} s: the small copies decide it (an unweighted least-"
                              "squares fit lets the large copies drown it; weigh each by 1/t)")

    return run_check("fit_copy_model", body, fn)
