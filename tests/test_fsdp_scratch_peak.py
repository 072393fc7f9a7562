"""FSDPFromScratch's peak of gathered weights is its schedule's, whoever holds a reference: each
unit's weights are freed at reshard (storage resized to 0, as torch's FSDP frees them) and
uncounted there, so neither that peak nor PeakBytes' moves with garbage collection or with a
backend that holds the gathered tensor after the all-gather returned (gloo's worker thread does,
for a moment: the peak used to wait for the tensor's Python object to die, and changed from run
to run)."""
from itertools import pairwise

import fsdp_peak_ranks
import pytest

import helpers
from helpers.tiny_models import make_model

CONDITIONS = ("as is", "gc off", "gc threshold 1", "gc after every op", "backend holds buffers")
KNOBS = ((True, False), (True, True), (False, False))   # (reshard_after_forward, prefetch)
WORLD = 2


def _unit_bytes():
    """Gathered bytes of each unit of the deep MLP, in forward order: its float32 parameters,
    padded to a multiple of the world size."""
    units = [m for m in make_model("mlp").modules()
             if any(True for _ in m.parameters(recurse=False))]
    return [4 * WORLD * -(-sum(p.numel() for p in m.parameters()) // WORLD) for m in units]


@pytest.fixture(scope="module")
def ranks():
    return helpers.launch(fsdp_peak_ranks.gathered_peaks, WORLD,
                          dict(conditions=CONDITIONS, knobs=KNOBS, steps=2),
                          backend="gloo", quiet=True, timeout=600)


def test_the_peak_is_the_schedules_under_every_condition(ranks):
    """Resharding: one unit, two with prefetching; without: all that backward needs. Nothing
    stays counted after a step."""
    sizes = _unit_bytes()
    designed = {(True, False): max(sizes),   # one unit at a time, in forward and in backward
                (True, True): max(a + b for a, b in pairwise(sizes)),   # and the next one
                # every unit kept from forward to backward, but the first: its input needs no
                (False, False): sum(sizes[1:])}   # gradient, so autograd saves none of its weights
    wrong = [(r, key, peak, left) for r, got in enumerate(ranks)
             for key, (peak, left, _) in got.items()
             if peak != designed[key[1:]] or left != [0] * len(left)]
    assert not wrong, (designed, wrong)


def test_peak_bytes_of_a_step_do_not_depend_on_who_holds_the_buffers(ranks):
    """PeakBytes counts a storage resized to 0 as freed, though a tensor still refers to it."""
    moved = []
    for r, got in enumerate(ranks):
        for knob in KNOBS:
            peaks = {name: got[(name, *knob)][2] for name in CONDITIONS}
            if len(set(peaks.values())) > 1:
                moved.append((r, knob, peaks))
    assert not moved, moved


def test_a_unit_returning_a_view_of_its_weights_is_refused():
    """Its output would point into freed memory (a crash or garbage in the next operation)."""
    for got in helpers.launch(fsdp_peak_ranks.returns_its_weights, WORLD, backend="gloo",
                              quiet=True, timeout=120):
        for reshard, told in got.items():
            assert told is not None and "'the model' returned a view of its gathered" in told \
                and ".clone()" in told, (reshard, told)
