"""The pictures of DistributedSampler's shards, of torchrun's restart and of Part II's step from
scratch draw the data they are given: the sampler's real indices and padding, a run's attempts
per epoch, split_batch's shards and the moves the chapter's allreduce makes."""
import matplotlib
import pytest
import torch
from matplotlib.colors import to_hex
from matplotlib.patches import Rectangle
from torch.utils.data.distributed import DistributedSampler

import helpers

matplotlib.use("Agg")


def _texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def _shards(n, world, epoch=0, **kwargs):
    out = []
    for r in range(world):
        sampler = DistributedSampler(list(range(n)), num_replicas=world, rank=r, seed=0,
                                     **kwargs)
        sampler.set_epoch(epoch)
        out.append(list(sampler))
    return out


@pytest.mark.parametrize("n, world, epoch", [(10, 4, 0), (10, 4, 1), (5, 2, 0), (3, 4, 0),
                                             (12, 4, 0), (7, 3, 2)])
def test_sampler_facts_are_the_samplers_order_and_padding(n, world, epoch):
    import matplotlib.pyplot as plt
    shards = _shards(n, world, epoch)
    facts = helpers.sampler_facts(shards, n, epoch=epoch)
    total = sum(map(len, shards))
    assert facts["padded"] == total - n
    assert [facts["order"][r::world] for r in range(world)] == shards      # dealt in turn
    assert sorted(facts["order"][:n]) == list(range(n))
    texts = _texts(helpers.plot_sampler(facts))
    drawn = [t for t in texts if t.isdigit()]
    assert sorted(drawn) == sorted(map(str, facts["order"] * 2))    # the order and every shard
    assert [t for t in texts if t.startswith("rank ")] == [f"rank {r}" for r in range(world)]
    assert any(f"{total} indices for {n} examples" in t for t in texts)
    assert any(f"the last {total - n} (hatched)" in t for t in texts) == (total > n)
    assert any(t.startswith(f"epoch {epoch}:") for t in texts)
    plt.close("all")


def test_sampler_picture_marks_the_padded_indices():
    import matplotlib.pyplot as plt
    facts = helpers.sampler_facts(_shards(10, 4), 10)
    assert facts["padded"] == 2 and facts["order"][10:] == facts["order"][:2]
    fig = helpers.plot_sampler(facts)
    hatched = [p for p in fig.axes[0].patches if p.get_hatch()]
    assert len(hatched) == 2 * 2                         # in the order row and in the shards
    plt.close(fig)


def test_sampler_facts_refuse_what_is_not_a_padded_deal():
    with pytest.raises(ValueError, match="drop_last"):
        helpers.sampler_facts(_shards(10, 4, drop_last=True), 10)
    with pytest.raises(ValueError, match="as many indices"):
        helpers.sampler_facts([[0, 1], [2]], 3)


HISTORY = [dict(epoch=1, attempt=0), dict(epoch=2, attempt=1), dict(epoch=3, attempt=1)]


def test_restart_facts_are_the_runs_attempts():
    facts = helpers.restart_facts(HISTORY, 2, failed_rank=1, fail_step=144, steps_per_epoch=96)
    first, second = facts["attempts"]
    assert (first["epochs"], first["lost"], first["resumed_from"]) == ([1], 2, None)
    assert first["lost_fraction"] == pytest.approx(0.5) and first["failed_rank"] == 1
    assert (second["epochs"], second["lost"], second["resumed_from"]) == ([2, 3], None, 1)
    with pytest.raises(ValueError, match="not in epoch 2"):
        helpers.restart_facts(HISTORY, 2, failed_rank=1, fail_step=50, steps_per_epoch=96)
    with pytest.raises(ValueError, match="out of order"):
        helpers.restart_facts([dict(epoch=1, attempt=1), dict(epoch=2, attempt=0)], 2)


@pytest.mark.parametrize("history, world", [
    (HISTORY, 2),
    ([dict(epoch=e, attempt=a) for e, a in [(1, 0), (2, 0), (3, 1), (4, 2), (5, 2)]], 4),
    ([dict(epoch=1, attempt=0), dict(epoch=2, attempt=0)], 2)])
def test_restart_picture_draws_every_attempt_rank_and_epoch(history, world):
    import matplotlib.pyplot as plt
    facts = helpers.restart_facts(history, world, failed_rank=world - 1)
    fig = helpers.plot_restart(facts)
    texts = _texts(fig)
    attempts = sorted({h["attempt"] for h in history})
    assert [t for t in texts if t.startswith("attempt ")] == [f"attempt {a}" for a in attempts]
    assert texts.count(f"rank {world - 1}") == len(attempts)        # every rank, every attempt
    every = "both" if world == 2 else f"all {world}"
    said = f"rank {world - 1} killed: torchrun restarts {every} ranks, each loads"
    assert sum(t.replace("\n", " ").startswith(said) for t in texts) == len(attempts) - 1
    assert texts.count("X") == len(attempts) - 1
    if len(history) <= 3:                                         # wide enough to say it
        for a in facts["attempts"][1:]:
            assert f"loads\nepoch {a['resumed_from']}" in texts
    boxes = [p for p in fig.axes[0].patches if isinstance(p, Rectangle)]
    grey = [p for p in boxes if to_hex(p.get_facecolor()) == "#dddddd"]   # snapshot loaded
    lanes = [p for p in boxes if to_hex(p.get_facecolor()) not in ("#ffffff", "#dddddd")]
    assert len(grey) == len(attempts) - 1
    assert len(lanes) == world * len(history)                   # each rank, each epoch run
    plt.close(fig)


@pytest.mark.parametrize("n, k", [(10, 4), (10, 3), (3, 4), (7, 2), (5, 1)])
def test_scratch_step_draws_split_batchs_shards_and_allreduces_moves(n, k):
    import matplotlib.pyplot as plt
    X, y = torch.arange(4.0 * n).reshape(n, 4), torch.arange(n)
    X_shards, y_shards = helpers.split_batch(X, y, [torch.device("cpu")] * k)
    facts = helpers.scratch_step_facts(X_shards, y_shards, helpers.allreduce)
    sizes = [len(s) for s in X.tensor_split(k)]
    assert facts["sizes"] == sizes and facts["batch"] == n and facts["target"] == 0
    assert facts["ops"] == [("add_", 0, i) for i in range(1, k)] + \
        [("copy_", i, 0) for i in range(1, k)]
    assert facts["holds"] == [list(range(k))] * k
    texts = _texts(helpers.plot_scratch_step(facts))
    assert [t.split("\n")[0] for t in texts if "row" in t] == \
        [f"{s} row" + "s" * (s != 1) for s in sizes]
    assert [t for t in texts if t.startswith("g") and "+" not in t] == \
        ([f"g{i}" for i in range(k)] if k > 1 else ["g0"] * 3)
    assert any(t.startswith(f"then sgd divides by {n}") for t in texts)
    plt.close("all")


@pytest.mark.parametrize("k", [2, 4])
def test_scratch_step_copies_back_only_to_the_devices_without_the_sum(k):
    """allreduce copies the sum to devices 1..k-1; device 0's gradient is the sum (add_ wrote
    into it), so the bottom row has k-1 copy arrows and one dashed line, to device 0."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch
    X, y = torch.arange(40.0).reshape(10, 4), torch.arange(10)
    X_shards, y_shards = helpers.split_batch(X, y, [torch.device("cpu")] * k)
    fig = helpers.plot_scratch_step(helpers.scratch_step_facts(X_shards, y_shards,
                                                               helpers.allreduce))
    ax = fig.axes[0]
    ends = [p._posA_posB[1] for p in ax.patches if isinstance(p, FancyArrowPatch)]
    bottom = max(e[1] for e in ends)
    assert sum(e[1] == bottom for e in ends) == k - 1
    dashed = [ln for ln in ax.lines if ln.get_linestyle() == "--"]
    assert len(dashed) == 1 and max(dashed[0].get_ydata()) == bottom
    assert min(e[0] for e in ends if e[1] == bottom) > dashed[0].get_xdata()[0]
    plt.close(fig)


def test_scratch_step_follows_the_allreduce_it_is_given():
    def into_the_last(data):
        for i in range(len(data) - 1):
            data[-1].add_(data[i])
        for i in range(len(data) - 1):
            data[i].copy_(data[-1])

    def rebinding(data):                          # the chapter's pitfall: rebinds list slots
        for i in range(1, len(data)):
            data[0].add_(data[i])
        for i in range(1, len(data)):
            data[i] = data[0].clone()
    shards = helpers.split_batch(torch.zeros(6, 2), torch.arange(6), [torch.device("cpu")] * 3)
    facts = helpers.scratch_step_facts(*shards, into_the_last)
    assert facts["target"] == 2 and facts["ops"][0] == ("add_", 2, 0)
    with pytest.raises(ValueError, match="not every one the sum"):
        helpers.scratch_step_facts(*shards, rebinding)
