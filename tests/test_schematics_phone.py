"""Schematics read on a phone, and the pictures of Part III's wrapper and Part VII's ring and
all-to-all show what their code does.

A phone shows the book's text column 342 CSS px wide (390-px screen); a figure wider than that
is shrunk to it, and its labels with it. helpers.schematics.phone_text_px measures the smallest
text as shown there; every schematic a chapter draws must keep it at PHONE_FLOOR or more."""
import matplotlib
import pytest
import torch

import helpers
from helpers.schematics import phone_text_px
from helpers.tiny_models import deep_mlp

matplotlib.use("Agg")
PHONE_FLOOR = 10.0      # CSS px: the smallest label a reader can read without zooming


def _figure(width, labels, axis_off=True):
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(width, 2))
    for x, (text, size) in zip((0.05, 0.5), labels):
        ax.text(x, 0.5, text, fontsize=size)
    if axis_off:
        ax.set_axis_off()
    return fig


def test_phone_text_px_shrinks_a_wide_figure_to_the_column():
    import matplotlib.pyplot as plt
    narrow = _figure(3.0, [("small", 8), ("big", 20)])
    wide = _figure(8.0, [("small", 8), ("big", 20)], axis_off=False)   # about 8 in wide
    px_narrow, text = phone_text_px(narrow)
    px_wide, _ = phone_text_px(wide)
    assert text == "small"
    assert px_narrow == pytest.approx(8 * narrow.dpi / 72)      # shown at its own size
    assert 8 * 342 / (72 * 8.3) < px_wide < 8 * 342 / (72 * 6.5)   # shrunk to 342 px
    assert phone_text_px(wide, column=2000)[0] == pytest.approx(px_narrow)
    plt.close("all")


def test_phone_text_px_counts_only_the_text_drawn():
    import matplotlib.pyplot as plt
    shown = _figure(3.0, [("a", 14), ("", 4)])                  # an empty label: not text
    hidden_ticks = _figure(3.0, [("a", 14)])                    # ticks of a hidden axis
    hidden_ticks.axes[0].tick_params(labelsize=5)
    assert phone_text_px(shown)[1] == "a"
    assert phone_text_px(hidden_ticks)[1] == "a"
    ticks = _figure(3.0, [("a", 14)], axis_off=False)
    ticks.axes[0].tick_params(labelsize=5)
    assert phone_text_px(ticks)[0] == pytest.approx(5 * ticks.dpi / 72)
    plt.close("all")


# ---- the wrapper around a module (Part III, custom_modules) -------------------------------------
@pytest.fixture(scope="module")
def one_rank():
    helpers.setup(0, 1, master_port=helpers.free_port(), backend="gloo", timeout=60)
    yield
    helpers.teardown()


def _steps():
    torch.manual_seed(0)
    X = torch.rand(4, 1, 28, 28)
    side = helpers.side_features(X)

    def full_step(model):
        out = model(X, side, aux=True)
        sum(v.sum() for v in out.values()).backward()

    def without_aux(model):
        model(X, side, aux=False)["logits"].sum().backward()
    return full_step, without_aux


def _wrapper_facts(**ddp_kwargs):
    return helpers.ddp_wrapper_facts(helpers.TwoInputNet, *_steps(), **ddp_kwargs)


def test_wrapper_facts_are_what_ddp_holds(one_rank):
    facts = _wrapper_facts()
    bare = helpers.TwoInputNet()
    params = [f"module.{n}" for n, _ in bare.named_parameters()]
    assert facts["keys"] == [f"module.{k}" for k in bare.state_dict()]
    assert facts["params"] == params and facts["hooks"] == len(params)
    assert sorted(sum(facts["buckets"], [])) == sorted(params)   # each gradient in one bucket
    assert facts["grad_bytes"] == 4 * sum(p.numel() for p in bare.parameters())
    assert facts["unused"] == ["module.aux_head.weight", "module.aux_head.bias"]
    assert facts["error"].startswith("Expected to have finished reduction")
    assert (facts["wrapper"], facts["module"]) == ("DistributedDataParallel", "TwoInputNet")


def test_wrapper_buckets_follow_the_cap(one_rank):
    one = _wrapper_facts()["buckets"]
    small = _wrapper_facts(bucket_cap_mb=0.01)["buckets"]     # 10 KB: the big layer alone
    assert len(one) == 1 and len(small) > 1
    assert sorted(sum(small, [])) == sorted(one[0])


def test_wrapper_facts_refuse_a_step_that_leaves_nothing_out(one_rank):
    full_step, _ = _steps()
    with pytest.raises(RuntimeError, match="leave a parameter out"):
        helpers.ddp_wrapper_facts(helpers.TwoInputNet, full_step, full_step)


def test_wrapper_picture_shows_the_runs_keys_hooks_and_buckets(one_rank):
    import matplotlib.pyplot as plt
    facts = _wrapper_facts(bucket_cap_mb=0.01)
    fig = helpers.plot_ddp_wrapper(facts)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts.count("module.") == len(facts["keys"])
    for k in facts["keys"]:
        assert k.removeprefix("module.") in texts
    assert texts.count("buffer") == len(facts["keys"]) - len(facts["params"])
    assert sum(t.startswith("bucket ") for t in texts) == len(facts["buckets"])
    assert f"{facts['hooks']} hooks, one\nper parameter" in texts
    assert any("2 parameters get no gradient" in t for t in texts)
    with pytest.raises(ValueError, match="is the model wrapped"):
        helpers.plot_ddp_wrapper(dict(facts, keys=["mean", *facts["keys"]]))
    plt.close("all")


# ---- Part VII's context-parallel ring and expert all-to-all ------------------------------------
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_ring_picture_names_the_block_each_rank_holds(layout):
    import matplotlib.pyplot as plt
    fig = helpers.plot_ring(16, 4, layouts=(layout,))
    drawn = sorted((t.get_position(), t.get_text()) for t in fig.axes[0].texts
                   if t.get_text())          # not the arrows (annotations)
    want = sorted(((i + 0.45, r + 0.4), f"K/V {src}" + ("" if share else "\nskipped"))
                  for r, row in enumerate(helpers.ring_schedule(16, 4, layout))
                  for i, (src, share) in enumerate(row))
    assert drawn == want
    plt.close(fig)


def _dispatch():
    torch.manual_seed(0)
    moe = helpers.MoE(width=16, hidden=32, n_experts=4, k=2, capacity_factor=None)
    return helpers.dispatch_counts(moe, torch.randn(256, 16), 4)


def test_all_to_all_table_shows_the_counts():
    import matplotlib.pyplot as plt
    counts = _dispatch()
    fig = helpers.plot_all_to_all(counts)
    table = fig.axes[1]
    drawn = {tuple(round(v) for v in t.get_position()): t.get_text() for t in table.texts}
    for (i, j), n in zip([(i, j) for i in range(4) for j in range(4)], counts.flatten()):
        assert drawn[(j, i)].split("\n")[0] == str(int(n))
    plt.close(fig)


# ---- every schematic, on a phone --------------------------------------------------------------
def _mesh():
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.2))      # as composed.ipynb draws it
    helpers.draw_mesh((2, 2, 2), ax)
    return fig


def _mesh2d():
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(3.6, 2.6))    # as mesh2d.ipynb draws it
    helpers.draw_mesh((1, 2, 2), ax)
    return fig


def _sampler_shards(n, world, epoch=0):
    from torch.utils.data.distributed import DistributedSampler
    shards = []
    for r in range(world):
        sampler = DistributedSampler(list(range(n)), num_replicas=world, rank=r, seed=0)
        sampler.set_epoch(epoch)
        shards.append(list(sampler))
    return shards


def _queue_run(n, reps):
    """A stamped round of gpus.ipynb's thread-as-stream demo, at its CPU and tiny sizes."""
    from concurrent.futures import ThreadPoolExecutor
    A, B = torch.randn(n, n), torch.randn(n, n)
    with ThreadPoolExecutor(max_workers=1) as stream:
        return helpers.queue_timeline(stream, lambda: torch.mm(A, B), reps)


def _launch_env(rank, world, addr="localhost"):
    """The variables torchrun gives a process of a one-machine job."""
    return dict(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                LOCAL_WORLD_SIZE=str(world), MASTER_ADDR=addr, MASTER_PORT="39693",
                TORCHELASTIC_USE_AGENT_STORE="True")


READABLE = {
    "context-parallel ring": lambda: helpers.plot_ring(16, 4),
    "context-parallel split": lambda: helpers.plot_split(16, 4),
    "expert all-to-all": lambda: helpers.plot_all_to_all(_dispatch()),
    "ring all-reduce": lambda: helpers.plot_ring_allreduce(4),
    "Megatron MLP": lambda: helpers.plot_megatron_mlp(k=4),
    "pipeline schedules": lambda: helpers.plot_pipeline_schedules(4, 4, v=2),
    "network split": lambda: helpers.plot_network_split(
        helpers.lenet_module(), {"a": [7], "b": [1, 3]}, (1, 28, 28)),
    "ZeRO shards": lambda: helpers.plot_shards(helpers.TinyLM(tied=False), world=2),
    "DDP buckets": lambda: helpers.plot_buckets(helpers.bucket_timeline(
        deep_mlp(8, 16, 2), (torch.zeros(2, 8),), 0.001)),
    "DDP buckets, ResNet-18 with a title": lambda: helpers.plot_buckets(
        helpers.bucket_timeline(helpers.resnet18(), (torch.zeros(2, 1, 28, 28),), 5),
        title="ResNet-18, 4 devices: the backward takes 1"),          # as costs.ipynb draws it
    "3-D mesh": _mesh,
    "2-D mesh": _mesh2d,
    "DataParallel step, 5 rows over 4 GPUs": lambda: helpers.plot_dp_step(helpers.dp_step_facts(
        torch.rand(5, 1, 28, 28), [f"GPU {i}" for i in range(4)])),       # as dataparallel.ipynb
    "DataParallel step, 10 rows over 4 GPUs": lambda: helpers.plot_dp_step(helpers.dp_step_facts(
        torch.rand(10, 1, 28, 28), [f"GPU {i}" for i in range(4)])),
    "DistributedSampler, 10 over 4 ranks": lambda: helpers.plot_sampler(helpers.sampler_facts(
        _sampler_shards(10, 4, epoch=1), 10, epoch=1)),                 # as ddp_torchrun.ipynb
    "DistributedSampler, 16 over 8 ranks": lambda: helpers.plot_sampler(helpers.sampler_facts(
        _sampler_shards(16, 8), 16)),
    "torchrun restart, 2 ranks": lambda: helpers.plot_restart(helpers.restart_facts(
        [dict(epoch=1, attempt=0), dict(epoch=2, attempt=1), dict(epoch=3, attempt=1)], 2,
        failed_rank=1, fail_step=144, steps_per_epoch=96)),             # as ddp_torchrun.ipynb
    "torchrun restart, 8 ranks, 10 epochs": lambda: helpers.plot_restart(helpers.restart_facts(
        [dict(epoch=e, attempt=int(e > 6)) for e in range(1, 11)], 8, failed_rank=3)),
    "torchrun job, 2 ranks": lambda: helpers.plot_torchrun(helpers.torchrun_facts(
        [_launch_env(r, 2) for r in range(2)])),                         # as ddp_torchrun.ipynb
    "torchrun job, 4 ranks, a long address": lambda: helpers.plot_torchrun(helpers.torchrun_facts(
        [_launch_env(r, 4, "node-0.cluster.example.internal") for r in range(4)])),
    "step from scratch, 10 rows over 4 devices": lambda: helpers.plot_scratch_step(
        helpers.scratch_step_facts(*helpers.split_batch(
            torch.arange(40.0).reshape(10, 4), torch.arange(10), [torch.device("cpu")] * 4),
            helpers.allreduce)),                                          # as scratch.ipynb
    "thread as a stream, 3 products": lambda: helpers.plot_queue_timeline(_queue_run(1024, 3)),
    "thread as a stream, quick mode's": lambda: helpers.plot_queue_timeline(_queue_run(256, 2)),
    "host and two GPUs": lambda: helpers.plot_gpu_machine(helpers.machine_links(
        helpers.LINK_SPECS, helpers.H200_DATASHEET["bw"])),                  # as gpus.ipynb
    "one stream and two": lambda: helpers.plot_two_streams(helpers.two_stream_facts()),
}


@pytest.mark.parametrize("name", READABLE)
def test_schematic_labels_are_readable_on_a_phone(name):
    import matplotlib.pyplot as plt
    torch.manual_seed(0)
    fig = READABLE[name]()
    px, text = phone_text_px(fig)
    plt.close(fig)
    assert px >= PHONE_FLOOR, f"{name}: {text!r} is {px:.1f} CSS px wide on a phone"


def test_the_wrapper_picture_is_readable_on_a_phone(one_rank):
    import matplotlib.pyplot as plt
    fig = helpers.plot_ddp_wrapper(_wrapper_facts())
    px, text = phone_text_px(fig)
    plt.close(fig)
    assert px >= PHONE_FLOOR, f"{text!r} is {px:.1f} CSS px on a phone"


def test_the_syncbn_picture_is_readable_on_a_phone():
    import matplotlib.pyplot as plt
    ranks = helpers.launch(helpers.syncbn_traffic, 2, dict(batch=4, channels=4, size=6),
                           backend="gloo", quiet=True)                  # as syncbn.ipynb
    fig = helpers.plot_syncbn(helpers.syncbn_facts(ranks))
    px, text = phone_text_px(fig)
    plt.close(fig)
    assert px >= PHONE_FLOOR, f"{text!r} is {px:.1f} CSS px on a phone"


def test_the_chapters_draw_these_schematics_with_the_measured_builders():
    """The chapters call the builders measured above, at the sizes measured (not draw_ring,
    draw_split or draw_all_to_all into axes of a notebook's own, wider figure)."""
    import json
    from pathlib import Path
    book = Path(__file__).resolve().parent.parent / "book"
    calls = {"part7/context_parallel": ["helpers.plot_ring(16, 4)", "helpers.plot_split(16, 4)"],
             "part7/expert_parallel": ["helpers.plot_all_to_all(counts)"],
             "part3/custom_modules": ["helpers.plot_ddp_wrapper(wrapper"],
             "part3/dataparallel": ["helpers.plot_dp_step(one_step)"],
             "part3/syncbn": ["helpers.plot_syncbn(helpers.syncbn_facts(traffic))"],
             "part3/ddp_torchrun": ["helpers.plot_sampler(\n    helpers.sampler_facts(shards",
                                    "helpers.plot_restart(helpers.restart_facts(",
                                    "helpers.plot_torchrun(helpers.torchrun_facts(envs))"],
             "part2/scratch": ["helpers.plot_scratch_step(\n    helpers.scratch_step_facts("],
             "gpus": ["helpers.plot_queue_timeline(timeline)"],
             "part6/mesh2d": ["helpers.draw_mesh((1, DP, TP), ax)"],
             "part7/composed": ["helpers.draw_mesh((2, 2, 2), ax)"]}
    for name, wanted in calls.items():
        code = "\n".join("".join(c["source"]) for c in json.loads(
            (book / f"{name}.ipynb").read_text())["cells"] if c["cell_type"] == "code")
        for call in wanted:
            assert call in code, f"{name} no longer draws {call}...)"
        for raw in ("helpers.draw_ring(", "helpers.draw_split(", "helpers.draw_all_to_all("):
            assert raw not in code, f"{name} draws {raw}...) into a figure of its own size"


@pytest.mark.parametrize("shape", [(1, 2, 2), (2, 2, 2), (1, 2, 4)])
def test_the_mesh_drawing_joins_exactly_the_groups_of_rank_grid(shape):
    """Each line drawn joins two consecutive ranks of one group of `rank_grid`, every such pair
    is drawn once, and a one-stage mesh draws no pipeline line and no stage label."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots()
    helpers.draw_mesh(shape, ax)
    at = {tuple(map(float, t.get_position())): int(t.get_text())
          for t in ax.texts if t.get_text().isdigit()}
    lines = [a for a in ax.texts if isinstance(a, matplotlib.text.Annotation)]
    drawn = sorted(tuple(sorted((at[tuple(map(float, a.xy))],
                                 at[tuple(map(float, a.xyann))]))) for a in lines)
    want = sorted(tuple(sorted(p)) for name, groups in helpers.rank_grid(shape).items()
                  if shape[0] > 1 or name != "pp" for g in groups for p in zip(g, g[1:]))
    stages = [t.get_text() for t in ax.texts if t.get_text().startswith("stage")]
    plt.close(fig)
    assert drawn == want
    assert len(stages) == (shape[0] if shape[0] > 1 else 0)
