"""Checks for the exercises of the DistributedDataParallel-with-torchrun chapter (Part III).

The sampler exercise may not reach DistributedSampler (by identity: a name bound earlier counts),
the loss exercise is judged by the gradients DDP's averaging makes of it on unequal shards, and
the resume exercise may not reach the course's loader or RNG restorer; its continuation must be
bitwise the run that was never stopped.
"""
import os
import random
import tempfile

import torch
from torch import nn
from torch.utils.data.distributed import DistributedSampler

from ..runtime import checkpoint
from ._core import CheckFailed, check, expect, fresh_generator, randint, tensor_close, tensor_equal
from ._core.declare import judged_scan
from ._core.gradients import grads_left
from ._core.inputs import expect_unchanged, kept
from ._core.references import Reference, blocked

__all__ = ["check_sampler_shard", "check_rank_loss", "check_resume"]


def _indices(value, what):
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    try:
        return [int(i) for i in value]
    except (TypeError, ValueError):
        raise CheckFailed(f"{what} returned {type(value).__name__}, expected a list of "
                          "indices") from None


class _Torch(Reference):
    whose = "torch's copy of what the exercise asks for"

    def __repr__(self):
        return self.name


try:
    import torch.distributed.elastic.utils.data  # loads ElasticDistributedSampler
except ImportError:         # pragma: no cover - every supported torch has it
    pass


def _torch_samplers():
    """DistributedSampler and torch's subclasses of it (ElasticDistributedSampler ...): each a
    copy of the shard the exercise asks for, refused with its own __iter__."""
    found, todo = [], [DistributedSampler]
    while todo:
        cls = todo.pop()
        if cls.__module__.split(".")[0] == "torch" and cls not in found:
            found.append(cls)
            todo.extend(cls.__subclasses__())
    return found


_GLOBAL_RNG = torch.default_generator     # bound at import: torch's CPU default generator


def _refuse_sampler(*args, **kwargs):
    raise CheckFailed("compute the shard yourself: do not iterate a DistributedSampler")


@check("sampler_shard", observes=[
    "the indices returned for fresh (n, rank, world, epoch, seed), padding included (one longer "
    "than the data), against DistributedSampler's",
    "torch's global random state, unchanged by the call (a reseeded default generator would "
    "reseed training's dropout and shuffling every epoch)",
    "by identity: the answer's code may not reach DistributedSampler, torch's subclasses of it "
    "(ElasticDistributedSampler) or their __iter__ (a copy bound before the check runs "
    "included), and their __iter__ raises while it runs"])
def check_sampler_shard(fn):
    """fn(n, rank, world_size, epoch, seed) must be the indices DistributedSampler(shuffle=True)
    gives that rank in that epoch, computed without DistributedSampler."""
    samplers = _torch_samplers()
    refuse = [_Torch(f"{c.__name__}.__iter__", c.__dict__["__iter__"])
              for c in samplers if "__iter__" in c.__dict__]
    try:
        judged_scan(fn.fn, [_Torch(c.__name__, c) for c in samplers] + refuse, "sampler_shard")
    except CheckFailed as e:
        name = max((c.__name__ for c in samplers if c.__name__ in str(e)), key=len,
                   default="DistributedSampler")
        raise CheckFailed(f"compute the shard yourself: your code uses torch's {name} (or its "
                          "__iter__), which computes the shard the exercise asks you to "
                          "write") from None
    g = fresh_generator()
    cases = [(randint(g, 5, 40), randint(g, 2, 4), randint(g, 1, 5), randint(g, 0, 99))
             for _ in range(6)]
    cases.append((10, 4, 1, 0))   # 10 over 4 ranks: padding needed
    cases.append((2, 5, randint(g, 1, 5), randint(g, 0, 99)))  # padding longer than the data
    for n, w, epoch, seed in cases:
        for r in range(w):
            what = f"sampler_shard({n}, {r}, {w}, epoch={epoch}, seed={seed})"
            saved, DistributedSampler.__iter__ = DistributedSampler.__iter__, _refuse_sampler
            state = _GLOBAL_RNG.get_state()
            try:
                with blocked(refuse, "sampler_shard"):   # a binding made before the check too
                    got = _indices(fn(n, r, w, epoch, seed), what)
            finally:
                DistributedSampler.__iter__ = saved
            moved = not tensor_equal(_GLOBAL_RNG.get_state(), state)
            _GLOBAL_RNG.set_state(state)
            expect(not moved, f"{what} changed torch's global random state (torch.manual_seed, "
                   "or a draw from the default generator): training's dropout and shuffling "
                   "draw from it, so every epoch would reseed them. Draw from a generator of "
                   "your own, as DistributedSampler does: "
                   "torch.Generator().manual_seed(seed + epoch)")
            s = DistributedSampler(range(n), num_replicas=w, rank=r, shuffle=True, seed=seed)
            s.set_epoch(epoch)
            want = list(s)
            expect(len(got) == len(want),
                   f"{what} has {len(got)} indices, expected {len(want)}: the sampler pads the "
                   f"permutation (repeating its first indices) to a multiple of {w} so every "
                   "rank runs the same number of steps")
            if got == want:
                continue
            s.set_epoch(0)
            expect(got != list(s) or epoch == 0,
                   f"{what} is epoch 0's shard: the permutation is seeded with seed + epoch "
                   "(that is what set_epoch changes)")
            perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))
            padded = (perm.tolist() * (w + 1))[:len(want) * w]
            expect(got != padded[r * len(want):(r + 1) * len(want)],
                   f"{what} is a contiguous block: the sampler takes every {w}-th index of the "
                   f"padded permutation, from {r}")
            raise CheckFailed(f"{what} = {got[:8]}..., expected {want[:8]}...")


def _grads(model, scalar):
    """The parameters' gradients from `scalar`'s backward (none left: the answer fails)."""
    model.zero_grad()
    scalar.backward()
    return list(grads_left(model.named_parameters(), "rank_loss's result").values())


@check("rank_loss", observes=[
    "the gradient DDP's averaging (the mean over ranks of each rank's gradient) makes of the "
    "scalar returned, on equal and on unequal random shards, against the gradient of the mean "
    "loss over the whole global batch"])
def check_rank_loss(fn):
    """fn(losses, global_batch, world_size) -> the scalar a rank backpropagates (from its
    per-example losses) so that DDP's AVERAGE of the ranks' gradients is the gradient of the mean
    loss over the whole global batch, also when the ranks' shards differ in size."""
    g = fresh_generator()
    for uneven in (False, True):
        w = randint(g, 2, 4)
        sizes = [randint(g, 1, 9) for _ in range(w)] if uneven else [randint(g, 2, 6)] * w
        if uneven and len(set(sizes)) == 1:
            sizes[0] += 3
        n = sum(sizes)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(randint(g, 0, 10**6))
            model = nn.Linear(3, 2)
        X, y = torch.randn(n, 3, generator=g), torch.randint(0, 2, (n,), generator=g)

        def per_example(idx, model=model, X=X, y=y):
            return nn.functional.cross_entropy(model(X[idx]), y[idx], reduction="none")
        params = [X, y, *model.parameters()]
        copies = kept(*params)
        ranks, start = [], 0
        for s in sizes:
            out = fn(per_example(slice(start, start + s)), n, w)
            expect(isinstance(out, torch.Tensor) and out.numel() == 1,
                   f"rank_loss returned {type(out).__name__}, expected a 0-d tensor")
            expect(out.requires_grad, "rank_loss's result has no gradient: compute it from "
                                      "`losses` (do not detach or call .item())")
            ranks.append(_grads(model, out.reshape(())))
            start += s
        expect_unchanged("rank_loss", copies, params, ["X", "y", "the weight", "the bias"])
        want = _grads(model, per_example(slice(None)).mean())     # after the answer ran
        got = [sum(r[i] for r in ranks) / w for i in range(len(want))]   # what DDP does
        if all(tensor_close(a, b, atol=1e-6) for a, b in zip(got, want, strict=True)):
            continue
        ratio = float(got[0].norm() / want[0].norm())
        shape = f"shards of {sizes} examples over {w} ranks"
        expect(abs(ratio - 1 / w) > 1e-3, f"{shape}: the gradient is {w} times too small: DDP "
                                          "already divides the summed gradients by the world size")
        expect(abs(ratio - n / w) > 1e-3, f"{shape}: the gradient is {n / w:g} times too large: "
                                          "a sum must be scaled")
        expect(uneven is False, f"{shape}: right only when every rank has the same number of "
                                "examples; with unequal shards the mean of per-rank means is not "
                                "the global mean: weight each rank by its share of the global "
                                "batch")
        raise CheckFailed(f"{shape}: the averaged gradient is not that of the mean loss over all "
                          f"{n} examples")


def _training_run(model, opt, steps):
    """Steps that draw from torch's and Python's RNGs (dropout, noise) and use momentum."""
    for _ in range(steps):
        X = torch.randn(16, 4) * (1 + random.random())
        loss = model(X).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def _fresh(seed):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 16), nn.Dropout(0.3), nn.Linear(16, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


@check("resume", changes_inputs=True, references=["load_snapshot", "set_rng_state"], observes=[
    "after the answer ran: the model's and the optimizer's state, torch's and Python's RNG "
    "states against rank 0's in a snapshot of two ranks' states, the epoch returned",
    "the continuation (dropout and momentum) against the run that was never stopped, bitwise"])
def check_resume(fn):
    """fn(path, model, optimizer) restores a snapshot written by helpers.save_snapshot into a
    fresh model and optimizer, restores torch's and Python's RNGs, and returns the next epoch;
    the continuation must then equal the uninterrupted run bitwise."""
    g = fresh_generator()
    seed, after, epoch = randint(g, 0, 10**6), randint(g, 2, 5), randint(g, 1, 20)
    state = (torch.get_rng_state(), random.getstate())     # the notebook's RNGs, given back
    try:
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "snapshot.pt")
            random.seed(seed)
            model, opt = _fresh(seed)
            for p in model.parameters():     # momentum drawn, not trained: no work before the call
                opt.state[p]["momentum_buffer"] = torch.randn(p.shape, generator=g)
            saved = (torch.get_rng_state(), random.getstate())     # the snapshot's rank 0's
            mine = checkpoint.rng_state()
            torch.manual_seed(seed + 3)         # two ranks, as save_snapshot_all writes them: a
            random.seed(seed + 3)               # rank 1 of other states, so an index tells
            checkpoint.save_snapshot(path, model, opt, epoch,
                                     rng=[mine, checkpoint.rng_state()])
            torch.manual_seed(seed + 1)
            random.seed(seed + 1)                          # a new process: other RNG states
            model2, opt2 = _fresh(seed + 2)
            got_epoch = fn(path, model2, opt2)
            snap = torch.load(path, weights_only=True)
            expect(all(tensor_equal(a, b) for a, b in zip(model2.state_dict().values(),
                                                          snap["model"].values(), strict=True)),
                   "the model's parameters are not the snapshot's: model.load_state_dict")
            expect(bool(opt2.state_dict()["state"]),
                   "the optimizer has no momentum buffers: load its state too "
                   "(optimizer.load_state_dict), or the next steps lose their momentum")
            expect(torch.get_rng_state().tolist() == snap["rng"][0]["torch"],
                   "torch's RNG is not rank 0's in the snapshot (snap[\"rng\"][0]: the list "
                   "holds one per rank): dropout would draw other masks; "
                   "torch.set_rng_state(torch.tensor(..., dtype=torch.uint8))")
            expect(random.getstate()[1] == tuple(snap["rng"][0]["python"][1]),
                   "Python's random is not restored to rank 0's state (snap[\"rng\"][0]): "
                   "random.setstate(...) (the version, a tuple of the state, the gauss value)")
            expect(got_epoch == epoch, f"returned {got_epoch!r}, expected the next epoch "
                                       f"{epoch} from the snapshot")
            resumed = (torch.get_rng_state(), random.getstate())   # the answer's RNGs
            torch.set_rng_state(saved[0])
            random.setstate(saved[1])
            _training_run(model, opt, after)               # the run that was never stopped
            torch.set_rng_state(resumed[0])
            random.setstate(resumed[1])
            _training_run(model2, opt2, after)
            expect(all(tensor_equal(a, b) for a, b in zip(model.parameters(),
                                                          model2.parameters(), strict=True)),
                   "the continuation differs from the run that never stopped")
    finally:
        torch.set_rng_state(state[0])
        random.setstate(state[1])
