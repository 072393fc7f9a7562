"""Every exercise check is on the harness and tested three ways (issue 19): declared with @check
(what it observes, the references it blocks), and registered in tests/check_cases.py with its
worked answer, at least two shortcuts of different kinds, and at least one other right answer.

A check still waiting for its conversion is listed in PENDING; the list may only shrink: a
check in it that is declared and has all three kinds of cases fails here until it is removed.
"""
import importlib
import pathlib

import pytest

import helpers.checks
from check_cases import CASES
from helpers.checks._core import REGISTRY

TESTS = pathlib.Path(__file__).resolve().parent
for path in sorted(TESTS.glob("test_checks_*.py")):
    if path.stem != "test_checks_registry":
        importlib.import_module(path.stem)     # fills CASES

# Parts III-VI: converted by the engineers of issue 19's second half
PENDING = {
    "check_accumulate_gradients", "check_amdahl_speedup", "check_average_bucket",
    "check_bucket_allreduce", "check_bucket_params", "check_checkpointed_forward",
    "check_choose_checkpoints", "check_crossover_bytes", "check_cuts_for_times",
    "check_dp_average", "check_dp_forward", "check_dp_shard_sizes", "check_fit_latency_bandwidth",
    "check_gather_layer", "check_global_mean_var", "check_grad_shard", "check_idle_share",
    "check_local_shape", "check_lr_at", "check_megatron_mlp", "check_mesh_groups",
    "check_overlap_hooks", "check_partition", "check_pipeline_forward", "check_predicted_speedup",
    "check_rank_loss", "check_resume", "check_ring_allreduce", "check_ring_allreduce_seconds",
    "check_row_parallel_linear", "check_sampler_shard", "check_saved_bytes_of_call",
    "check_shard_flat", "check_strip_module_prefix", "check_sync_bn_input_grads",
    "check_time_it", "check_time_shares", "check_tp_ring_bytes", "check_unused_parameters",
    "check_update_running_stats", "check_zero1_optimizer", "check_zero3_sent_bytes",
}
CHECKS = sorted(n for n in dir(helpers.checks) if n.startswith("check_")
                and callable(getattr(helpers.checks, n)))


def _complete(name):
    cases = CASES.get(name, {"worked": [], "shortcuts": [], "others": []})
    kinds = {c.label for c in cases["shortcuts"]}
    return bool(cases["worked"]) and len(kinds) >= 2 and bool(cases["others"])


@pytest.mark.parametrize("name", CHECKS)
def test_every_check_is_declared_and_tested_three_ways(name):
    if name in PENDING:
        assert not (name in REGISTRY and _complete(name)), (
            f"{name} is converted and tested: remove it from PENDING")
        return
    assert name in REGISTRY, f"{name} is not declared with @check (helpers/checks/_core)"
    cases = CASES.get(name)
    assert cases, f"{name} has no cases in tests/test_checks_*.py (tests/check_cases.py)"
    assert cases["worked"], f"{name}: no @worked answer"
    kinds = {c.label for c in cases["shortcuts"]}
    assert len(kinds) >= 2, f"{name}: shortcuts of {len(kinds)} kind(s) {sorted(kinds)}; need 2"
    assert cases["others"], f"{name}: no @other right answer"
    assert REGISTRY[name].observes, f"{name} declares nothing it observes (teachers.md)"


def test_pending_checks_exist():
    assert PENDING <= set(CHECKS), sorted(PENDING - set(CHECKS))


@pytest.mark.parametrize("name", CHECKS)
def test_a_stub_is_not_done_yet(name, monkeypatch, capsys):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.delenv("COURSE_GRADING", raising=False)

    def stub(*args, **kwargs):
        raise NotImplementedError()
    assert getattr(helpers.checks, name)(stub).status == "not done"


def test_teachers_guide_lists_what_every_check_observes():
    import sys
    sys.path.insert(0, str(TESTS.parent / "scripts"))
    import student_edition as se
    text = se.TEACHERS.read_text()
    begin = text.index(se.CHECKS_BEGIN) + len(se.CHECKS_BEGIN)
    assert text[begin:text.index(se.CHECKS_END)].strip() == se.checks_table(), (
        "book/teachers.md's checks table is out of date: run "
        ".venv/bin/python scripts/student_edition.py --update-teachers-guide")
