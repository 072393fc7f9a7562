"""Property test of the from-scratch wrappers: on random small models and runs, each
wrapper, on real gloo ranks, ends where one process ends, and where torch's counterpart ends;
or it refuses the case when it is built, with a message naming the fix.

The cases (tests/wrapper_cases.py): depth and width (not divisible by the world size), frozen,
reused, tied and unused layers, world sizes 1-4, 1-3 micro-batches per step, SGD, momentum or
AdamW with weight-decay groups, and a save and resume in the middle of the run.

CI runs the "ci" profile: a fixed seed (derandomized), 5 drawn cases and 2 fixed hard ones per
wrapper (each also against torch's counterpart), about a minute of 2 cores (64 s of CPU). By
hand, many examples with fresh draws:
    WRAPPERS_PROFILE=long pytest -q tests/test_wrappers_property.py     # ~300 examples each
    WRAPPERS_EXAMPLES=1000 WRAPPERS_PROFILE=long pytest ...              # as many as you like
Ranks start once per world size (tests/rank_pool.py) and serve every case.
"""
import os
import re

import pytest

hypothesis = pytest.importorskip("hypothesis")   # pinned in requirements/test.txt
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from rank_pool import JobFailed, RankPool  # noqa: E402
from wrapper_cases import WRAPPERS, one_process, train_case  # noqa: E402

import helpers  # noqa: E402

settings.register_profile("ci", max_examples=int(os.environ.get("WRAPPERS_EXAMPLES", 5)),
                          derandomize=True, deadline=None, database=None,
                          suppress_health_check=list(HealthCheck), print_blob=True)
settings.register_profile("long", max_examples=int(os.environ.get("WRAPPERS_EXAMPLES", 300)),
                          deadline=None, suppress_health_check=list(HealthCheck),
                          print_blob=True)
PROFILE = os.environ.get("WRAPPERS_PROFILE", "ci")
MAX_WORLD = 4


@st.composite
def cases(draw, max_world=MAX_WORLD):
    """A random case (see tests/wrapper_cases.py)."""
    num_steps = draw(st.integers(1, 3))
    return dict(
        seed=draw(st.integers(0, 10_000)),
        d_in=draw(st.integers(1, 6)), width=draw(st.integers(1, 7)),
        d_out=draw(st.integers(2, 5)),
        blocks=draw(st.lists(st.sampled_from(["plain", "frozen", "reused", "tied", "unused"]),
                             max_size=3)),
        world=draw(st.integers(1, max_world)), batch=draw(st.integers(1, 3)),
        accum=draw(st.integers(1, 3)), num_steps=num_steps,
        optim=draw(st.sampled_from(["sgd", "momentum", "adamw"])), groups=draw(st.booleans()),
        resume_at=draw(st.none() | st.integers(1, max(1, num_steps - 1))) if num_steps > 1
        else None)


@pytest.fixture(scope="module")
def pools(tmp_path_factory):
    """One RankPool per world size, started when first needed, stopped at the end."""
    started = {}

    def get(world):
        if world not in started:
            started[world] = RankPool(world)
        return started[world]
    get.dir = str(tmp_path_factory.mktemp("wrappers"))
    yield get
    for pool in started.values():
        pool.close()


def run(pools, name, case):
    """The full parameters WRAPPERS[name] ends with on case's ranks (rank 0's), or JobFailed."""
    out = pools(case["world"]).run(train_case, dict(case=case, wrapper=name, dir=pools.dir))
    for r, params in enumerate(out[1:], 1):   # every rank holds the same full weights
        assert helpers.max_diff(params, out[0]) <= 1e-6, (name, r, case)
    return out[0]


def check_wrapper(pools, name, case):
    """The property: equal to one process (and to torch's counterpart), or refused at build."""
    wrapper = WRAPPERS[name]
    case = wrapper.adapt(case)
    if wrapper.skip(case):
        return None
    refusal = wrapper.refuses(case)
    if refusal is not None:
        with pytest.raises(JobFailed) as info:
            run(pools, name, case)
        for r, message in info.value.errors.items():
            assert "refused at build" in message and re.search(refusal, message), (r, message)
        return None
    got = run(pools, name, case)
    ref = one_process(case)
    diff = helpers.max_diff(got, ref)
    assert diff <= wrapper.tol, f"{name}: {diff:.2e} from one process on {case}"
    return got


def scratch_names():
    return sorted(n for n in WRAPPERS if ":" not in n)


# every kind of layer, 3 and 4 ranks, 3 micro-batches and a resume, whatever the draws
HARD = [dict(seed=7, d_in=4, width=5, d_out=3, blocks=["frozen", "reused", "tied", "unused"],
             world=3, batch=2, accum=3, num_steps=3, optim="adamw", groups=True, resume_at=2),
        dict(seed=11, d_in=2, width=7, d_out=2, blocks=["tied", "plain"], world=4, batch=1,
             accum=2, num_steps=2, optim="momentum", groups=False, resume_at=1)]


@settings(settings.get_profile(PROFILE))
@given(case=cases())
@example(case=HARD[0])
@example(case=HARD[1])
@pytest.mark.parametrize("name", scratch_names())
def test_wrapper_equals_one_process_and_torch(pools, name, case):
    got = check_wrapper(pools, name, case)
    torch_name = name + ":torch"
    if torch_name not in WRAPPERS or got is None:
        return
    theirs = check_wrapper(pools, torch_name, case)
    if theirs is not None:
        diff = helpers.max_diff(got, theirs)
        assert diff <= WRAPPERS[name].tol, f"{name}: {diff:.2e} from torch's on {case}"
