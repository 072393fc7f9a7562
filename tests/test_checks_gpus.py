"""The checks of the foundation chapter's exercises (helpers/checks/gpus.py): the reference
solutions pass, a stub reports "not done", and typical wrong answers fail with their message."""
import pytest
import torch

from helpers.checks import check_copy_time, check_matmul_flops, check_tensor_bytes


# The reference solutions, as the notebook has them between the nbgrader markers.
def matmul_flops(n):
    ### BEGIN SOLUTION
    return 2 * n**3   # n² outputs, each needs n multiplies and n adds
    ### END SOLUTION


def tensor_bytes(tensors):
    ### BEGIN SOLUTION
    return sum(t.numel() * t.element_size() for t in tensors)
    ### END SOLUTION


def copy_time(num_bytes, bandwidth_gbs, latency_s):
    ### BEGIN SOLUTION
    return latency_s + num_bytes / (bandwidth_gbs * 1e9)
    ### END SOLUTION


def stub(*args):
    raise NotImplementedError()


CHECKS = [(check_matmul_flops, matmul_flops), (check_tensor_bytes, tensor_bytes),
          (check_copy_time, copy_time)]
IDS = [c.__name__ for c, _ in CHECKS]


@pytest.mark.parametrize("check,solution", CHECKS, ids=IDS)
def test_reference_solution_passes(check, solution):
    for _ in range(10):   # fresh inputs every call: pass every time
        result = check(solution)
        assert result and result.status == "passed", result


@pytest.mark.parametrize("check,solution", CHECKS, ids=IDS)
def test_stub_reports_not_done(check, solution, capsys):
    result = check(stub)
    assert result.status == "not done" and not result
    assert "not done yet" in capsys.readouterr().out


@pytest.mark.parametrize("check,solution", CHECKS, ids=IDS)
def test_inputs_are_fresh(check, solution):
    """Two runs of a check use different inputs, so an answer cannot memorise them."""
    runs = []
    for _ in range(2):
        seen = []
        check(lambda *args: (seen.append(repr(args)), solution(*args))[1])
        runs.append(seen)
    assert runs[0] and runs[0] != runs[1]


def test_matmul_flops_wrong():
    r = check_matmul_flops(lambda n: 2 * 64**3)   # right for the n shown in the notebook only
    # (2·64³ is also 2·n² for n = 512, which the check may draw and then names)
    assert r.status == "failed" and ("expected 2·n³" in r.message or "2·n²" in r.message)
    r = check_matmul_flops(lambda n: 1001)          # neither n³ nor 2·n² for any integer n
    assert r.status == "failed" and "returned 1001, expected 2·n³" in r.message
    assert "two operations" in check_matmul_flops(lambda n: n**3).message
    assert "n² output entries" in check_matmul_flops(lambda n: 2 * n * n).message
    assert "expected a number" in check_matmul_flops(lambda n: None).message


def test_tensor_bytes_wrong():
    r = check_tensor_bytes(lambda ts: sum(t.numel() for t in ts))
    assert r.status == "failed" and "the number of elements" in r.message
    r = check_tensor_bytes(lambda ts: 4 * sum(t.numel() for t in ts))
    assert "as if every element took 4 bytes" in r.message
    r = check_tensor_bytes(lambda ts: 1024)
    assert r.status == "failed" and "you returned 1024, expected" in r.message
    r = check_tensor_bytes(lambda ts: ts[0].numel() * ts[0].element_size())   # first tensor only
    assert r.status == "failed" and "bytes" in r.message


def test_copy_time_wrong():
    r = check_copy_time(lambda b, bw, lat: b / (bw * 1e9))
    assert r.status == "failed" and "the latency term is missing" in r.message
    r = check_copy_time(lambda b, bw, lat: lat)
    assert "the bandwidth term num_bytes / (bandwidth_gbs·1e9) is missing" in r.message
    r = check_copy_time(lambda b, bw, lat: lat + b / bw)
    assert "multiply it by 1e9" in r.message
    r = check_copy_time(lambda b, bw, lat: 1e-5)
    assert r.status == "failed" and "expected latency_s + num_bytes" in r.message


# ---- fit_copy_model: the check makes its own measurements, so a fit must use them -------------
def fit_copy_model(nbytes, seconds):
    t = torch.tensor(seconds, dtype=torch.float64)
    A = torch.stack([torch.ones_like(t), torch.tensor(nbytes, dtype=torch.float64)], 1)
    sol = torch.linalg.lstsq(A / t[:, None], torch.ones(len(t), 1, dtype=torch.float64)).solution
    alpha, slope = sol.squeeze(1).tolist()
    return alpha, 1 / slope / 1e9


def test_fit_copy_model():
    from helpers.checks import check_fit_copy_model
    for _ in range(5):            # fresh random data each time: the worked answer always passes
        assert check_fit_copy_model(fit_copy_model)
    assert check_fit_copy_model(stub).status == "not done"
    # typical numbers, not a fit: passes only by luck, and never four times in a row
    assert_fails(check_fit_copy_model(lambda n, t: (10e-6, 25.0)), "these copies were made")
    def largest_only(n, t):       # bandwidth from the largest copy, no latency
        return 0.0, n[-1] / t[-1] / 1e9
    assert_fails(check_fit_copy_model(largest_only), "smallest copies")
    def bytes_per_s(n, t):
        a, b = fit_copy_model(n, t)
        return a, b * 1e9
    assert_fails(check_fit_copy_model(bytes_per_s), "bytes/s")


def assert_fails(result, words):
    assert result.status == "failed", result
    assert words in result.message, result.message
