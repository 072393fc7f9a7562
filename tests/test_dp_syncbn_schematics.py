"""The pictures of DataParallel's step and of SyncBatchNorm's traffic draw the data they are
given: torch.chunk's pieces and idle devices, and the statistics and collectives of a real
two-rank run."""
import dataclasses
import inspect

import matplotlib
import pytest
import torch

import helpers

matplotlib.use("Agg")


def _texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts]


@pytest.mark.parametrize("n, k", [(5, 4), (10, 4), (512, 3), (2, 4)])
def test_dp_step_draws_torch_chunks_pieces_and_idle_devices(n, k):
    import matplotlib.pyplot as plt
    chunks = [len(c) for c in torch.arange(n).chunk(k)]
    facts = helpers.dp_step_facts(torch.rand(n, 3), [f"GPU {i}" for i in range(k)])
    assert facts["pieces"] == chunks + [0] * (k - len(chunks))
    assert facts["replicas"] == [f"GPU {i}" for i in range(len(chunks))]
    texts = _texts(helpers.plot_dp_step(facts))
    assert [t for t in texts if t.endswith(("row", "rows")) and "\n" not in t] == \
        [f"{p} row" + "s" * (p != 1) for p in chunks]
    assert sum(t.startswith("replica\n") for t in texts) == len(chunks)
    assert [t for t in texts if t.endswith("idle")] == \
        [f"GPU {i}: no rows, idle" for i in range(len(chunks), k)]
    assert any(f"the {len(chunks)} replicas' gradients" in t for t in texts)
    plt.close("all")


def test_dp_step_replicates_as_dataparallel_does():
    """DataParallel gives replicas only to the devices that got a piece of the batch."""
    source = inspect.getsource(torch.nn.DataParallel.forward)
    assert "self.device_ids[: len(inputs)]" in source.replace("[:len", "[: len")


@pytest.fixture(scope="module")
def traffic():
    cfg = dict(batch=6, channels=3, size=4, seed=1)
    return cfg, helpers.launch(helpers.syncbn_traffic, 2, cfg, backend="gloo", quiet=True)


def test_syncbn_facts_are_the_runs_statistics_and_collectives(traffic):
    cfg, ranks = traffic
    facts = helpers.syncbn_facts(ranks)
    g = torch.Generator().manual_seed(cfg["seed"])
    X = torch.randn(cfg["batch"], cfg["channels"], cfg["size"], cfg["size"], generator=g) * 2 + 1
    c, dims = cfg["channels"], (0, 2, 3)
    for row, shard in zip(facts["ranks"], X.chunk(2), strict=True):
        assert row["count"] == shard.numel() // c
        torch.testing.assert_close(row["mean"], shard.mean(dims))
        torch.testing.assert_close(row["own_mean"], shard.mean(dims))
        torch.testing.assert_close(row["var"], shard.var(dims, unbiased=False))
        torch.testing.assert_close(row["own_var"], shard.var(dims, unbiased=False))
        assert (row["sent"], row["sums"]) == (1 + 2 * c, 2 * c)
    torch.testing.assert_close(facts["world"]["mean"], X.mean(dims))
    torch.testing.assert_close(facts["world"]["var"], X.var(dims, unbiased=False))
    torch.testing.assert_close(facts["world"]["invstd"],
                               torch.rsqrt(X.var(dims, unbiased=False) + 1e-5))
    assert facts["world"]["count"] == X.numel() // c and facts["bn_calls"] == 0


def test_syncbn_picture_draws_the_facts(traffic):
    import matplotlib.pyplot as plt
    facts = helpers.syncbn_facts(traffic[1])
    texts = _texts(helpers.plot_syncbn(facts))
    w = facts["world"]
    glob = f"global: {w['count']} values\nmean {w['mean'][0]:.2f}\nvar {w['var'][0]:.2f}"
    assert texts.count(glob) == 2
    for r, row in enumerate(facts["ranks"]):
        assert f"rank {r}: {row['count']} values\nmean {row['own_mean'][0]:.2f}" \
            f"\nvar {row['own_var'][0]:.2f}" in texts
    assert any(f"{facts['ranks'][0]['sent']} numbers a rank" in t for t in texts)
    assert any(f"{facts['ranks'][0]['sums']} numbers a rank" in t for t in texts)
    assert any(t.startswith("0 collectives") for t in texts)
    plt.close("all")


def test_syncbn_facts_refuse_other_traffic(traffic):
    ranks = [dataclasses.replace(r, sync_calls=r.sync_calls[:1]) for r in traffic[1]]
    with pytest.raises(ValueError, match="expected one all_gather"):
        helpers.syncbn_facts(ranks)
