"""Ranks that do not run the same collectives are refused, naming each rank's, before the
collective runs: never gloo's SIGABRT ("Received data size doesn't match"), a hang, or (where
the sizes agree) the wrong tensors mixed without a word. The checks go through the process
group's store (helpers.runtime.agree), so they are not counted as traffic."""
import pytest
import reliability_ranks

import helpers


@pytest.fixture(scope="module")
def told():
    return helpers.launch(reliability_ranks.mismatches, 2, quiet=True, timeout=120)


@pytest.mark.parametrize("case,words", [
    ("fsdp: unit 1 on rank 0 only", ["rank 0: the all-gather of unit 1 ('1', 36 elements",
                                     "rank 1: the all-gather of unit 2 ('2', 27 elements",
                                     "every rank must run every FSDP unit"]),
    ("fsdp: same-sized unit 1 on rank 0 only", ["rank 0: the all-gather of unit 1 ('1', 36",
                                                "rank 1: the all-gather of unit 2 ('2', 36"]),
    ("fsdp: each rank skips another unit", ["rank 0: the all-gather of unit 1",
                                            "rank 1: the all-gather of unit 2"]),
    ("fsdp: models differ", ["an FSDPFromScratch in 2 units (4 tensors, fingerprint",
                             "build the same model"]),
    ("zero2: models differ", ["rank 0: a Zero2 (4 tensors", "build the same model"]),
    ("zero1: models differ", ["rank 0: a ShardedOptimizer (4 tensors", "build the same model"]),
    ("ddp: models differ", ["rank 0: a DDPFromScratch (4 tensors", "build the same model"]),
    ("fsdp: finish on rank 0 only", ["rank 0: finish_gradient_synchronization after 11 "
                                     "collectives (ag0 ag1 ag2 ag3 ag3 rs3",
                                     "rank 1: the all-gather of unit 0 ('0', 20 elements"]),
    ("fsdp: a later step mixes two units of one size", [
        "rank 0: finish_gradient_synchronization after 8 collectives (ag0 ag1 ag3",
        "rank 1: finish_gradient_synchronization after 8 collectives (ag0 ag2 ag3"]),
    ("fsdp: clip on rank 0 only", ["rank 0: the all-reduce of clip_grad_norm_",
                                   "rank 1: what rank 1 does next"]),
    ("zero2: one more backward on rank 0", ["rank 0: finish after step() 0, [2, 2, 2, 2] reduce",
                                            "rank 1: finish after step() 0, [1, 1, 1, 1] reduce",
                                            "run the same backwards on every rank"]),
])
def test_ranks_running_other_collectives_are_refused_naming_each(told, case, words):
    for rank, got in enumerate(told):
        kind, message = got[case]
        assert kind == "CollectiveMismatch", (rank, kind, message)
        assert all(w in message for w in words), (rank, message)


def test_after_a_refusal_the_ranks_go_on_in_step(told):
    assert all(got["fine again"] == ("ok", None) for got in told), told


def test_a_rank_that_never_comes_is_named(tmp_path, monkeypatch):
    """'finish on one rank only': not gloo's bare timeout, but who did not get there; while a
    rank waits, its progress says for whom (what a LaunchTimeout quotes)."""
    told = helpers.launch(reliability_ranks.agree_alone, 2, quiet=True, timeout=60)
    assert "rank 0 was about to run a lonely agreement, but rank 1 did not get there" \
        in told[0], told[0]
    import time

    from helpers.runtime import progress
    note = tmp_path / "rank0.progress"
    monkeypatch.setattr(progress, "_progress_file", note)
    monkeypatch.setattr(progress, "_NOTE_AFTER", 0.2)
    note.write_text("step 3/10")
    with progress.waiting("waits for ranks to run finish"):
        assert note.read_text() == "step 3/10", "a short wait writes nothing"
        time.sleep(0.8)
        assert note.read_text() == "waits for ranks to run finish"
    assert note.read_text() == "step 3/10"
