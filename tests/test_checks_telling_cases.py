"""The case that tells a natural wrong answer apart is forced into every call, so the verdict is
the same on every draw: ring_forward shifts every key of one world by a shared vector (attention
unchanged, scores in the hundreds: an online softmax without a running maximum overflows, in
float64 too); keep_within_capacity routes with k = 1 and k = 3 as well as k = 2 (a top-2 answer
spelled out, or one that serves the later choices token by token, is wrong). Each wrong answer
fails on several replayed draws; the right answers beside them pass on the same draws."""
import math

import pytest
import test_checks_part7  # noqa: F401  (registers the notebooks' worked answers)
import torch
from check_cases import CASES, not_grading, other, parametrize_cases, shortcut  # noqa: F401

import helpers
from helpers.checks._core.inputs import replay_seeds

SEEDS = range(4)


def _ring(q, k, v, comm, merge):
    """A ring forward: K and V passed to the next rank world - 1 times, each block merged into
    the running state by merge(state, s, v), state None at first; returns (acc, l)."""
    r, w = comm.rank, comm.world
    state = None
    for i in range(w):
        state = merge(state, q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), v)
        if i == w - 1:
            break
        comm.send(k, (r + 1) % w, tag=2 * i)
        comm.send(v, (r + 1) % w, tag=2 * i + 1)
        k = comm.recv((r - 1) % w, k.shape, tag=2 * i)
        v = comm.recv((r - 1) % w, v.shape, tag=2 * i + 1)
        comm.wait()
    return state


def _no_max(state, s, v):
    acc, l = (0, 0) if state is None else state
    return acc + s.exp() @ v, l + s.exp().sum(-1)


@shortcut("check_ring_forward", "an online softmax with no running maximum (exp of raw scores)",
          "running maximum")
def ring_forward_no_max(q, k, v, comm):
    acc, l = _ring(q, k, v, comm, _no_max)
    return acc / l[..., None]


@shortcut("check_ring_forward", "no running maximum, the sums kept in float64",
          "running maximum")
def ring_forward_no_max_float64(q, k, v, comm):
    acc, l = _ring(q, k, v, comm, lambda state, s, v: _no_max(state, s.double(), v.double()))
    return (acc / l[..., None]).float()


def _with_max(state, s, v):
    m = s.amax(-1)
    if state is not None:
        m = torch.maximum(m, state[2])
    e = (s - m[..., None]).exp()
    if state is None:
        return e @ v, e.sum(-1), m
    acc, l, old = state
    scale = (old - m).exp()
    return acc * scale[..., None] + e @ v, l * scale + e.sum(-1), m


@other("check_ring_forward", "the student's own online softmax, with a running maximum")
def ring_forward_own_max(q, k, v, comm):
    acc, l, _ = _ring(q, k, v, comm, _with_max)
    return acc / l[..., None]


def _served(expert, capacity, n_experts, order):
    used, kept = [0] * n_experts, torch.zeros(expert.shape, dtype=torch.bool)
    for i, j in order:
        e = int(expert[i, j])
        if used[e] < capacity:
            used[e] += 1
            kept[i, j] = True
    return kept


@shortcut("check_keep_within_capacity", "top-2 spelled out: column 0, then column 1",
          [("raised", "every first choice")])
def keep_top2_literal(expert, capacity, n_experts):
    n = expert.shape[0]
    return _served(expert, capacity, n_experts, [(i, j) for j in (0, 1) for i in range(n)])


@shortcut("check_keep_within_capacity", "first choices first, then each token's other choices",
          "every first choice")
def keep_first_then_by_token(expert, capacity, n_experts):
    n, k = expert.shape
    return _served(expert, capacity, n_experts, [(i, 0) for i in range(n)]
                   + [(i, j) for i in range(n) for j in range(1, k)])


@other("check_keep_within_capacity", "choice-major order from enumerate over the columns")
def keep_choice_major(expert, capacity, n_experts):
    n, k = expert.shape
    return _served(expert, capacity, n_experts, [(i, j) for j in range(k) for i in range(n)])


test_case = parametrize_cases(__name__)

CHECKS = ["check_ring_forward", "check_keep_within_capacity"]


@pytest.mark.parametrize("case", [c for name in CHECKS for c in CASES[name]["shortcuts"]
                                  if c.module == __name__], ids=repr)
def test_wrong_answer_fails_on_every_draw(case):
    """Each wrong answer above fails on every replayed draw, not on most."""
    for seed in SEEDS:
        replay_seeds(seed)
        case.judge()


@pytest.mark.parametrize("case", [c for name in CHECKS for c in
                                  CASES[name]["worked"] + CASES[name]["others"]
                                  if c.module in (__name__, "test_checks_part7")], ids=repr)
def test_right_answer_passes_on_every_draw(case):
    """The worked answers (the notebooks' solution cells) and the right answers written
    differently pass on the same draws: scores in the hundreds are no trouble with the max."""
    for seed in SEEDS:
        replay_seeds(seed)
        case.judge()


def test_keep_within_capacity_draws_one_two_and_three_choices(monkeypatch):
    """Every call hands k = 1, 2 and 3 choices per token."""
    seen = []

    def spy(expert, capacity, n_experts):
        seen.append(expert.shape[1])
        return keep_choice_major(expert, capacity, n_experts)
    for seed in SEEDS:
        replay_seeds(seed)
        seen.clear()
        assert helpers.checks.check_keep_within_capacity(spy).passed
        assert {1, 2, 3} <= set(seen), seen
