"""Part IV: the fast data-parallel trainer. Same model, same optimizer, same data order as Part II's
`train_batch`, so the same parameters come out (bitwise on a CPU in eager mode; within float
rounding with torch.compile or on a GPU) -- only faster:

- the data live on the device as two tensors; a batch is an index gather (ResidentLoader);
- each replica's parameters and gradients are views into ONE flat buffer, so the allreduce and the
  SGD update are one operation each, not one per parameter (FastDataParallel);
- one backward call for all replicas (autograd runs the devices in parallel);
- compile=True: each replica's forward AND backward are one torch.compile'd function
  (torch.func.grad_and_value), which fuses the elementwise work and lays the convolutions out
  channels-last; on a CPU it compiles `lenet_fused` (data_parallel/fast_lenet.py), which also
  leaves out what LeNet's pools throw away and fuses conv1 with its ReLU and pool (the first
  steps pay the compile; scripts/bench.py measures what it buys);
- on a GPU, the whole step is captured once as a CUDA graph and replayed: one launch per step
  instead of a few hundred;
- across processes (group=...), each rank trains on its slice of the global batch and the flat
  gradients travel in ONE all_reduce.
The allreduce variants (flat, bucketed, ring, overlapped with backward) are in
data_parallel/allreduce.py.
"""
import math
import warnings
from collections import Counter

import torch

from ..data import load_tensors
from ..devices import Timer, get_devices
from ..models import init_lenet_params, lenet, loss
from ..plotting import Animator
from ..validate import validate_lr, validate_positive_int, validate_seed
from .allreduce import flatten
from .fast_lenet import fused_flat_grad, tap_major, untap
from .simulated import allreduce, evaluate_accuracy

__all__ = ["ResidentLoader", "FastDataParallel", "train_fast", "resident_accuracy", "flat_replica",
           "replica_flat_grad"]


class ResidentLoader:
    """Shuffled minibatches from tensors already on the device: no workers, no per-image work.

    Epoch e's order is the e-th `torch.randperm(n, generator=g)` of a CPU generator g seeded with
    `seed` (so a run is reproducible and another trainer can be fed the same order); a batch is
    X[idx] for consecutive slices idx of that permutation.
    `index_batches()` gives the index tensors themselves (what FastDataParallel.step takes).
    """

    def __init__(self, X, y, batch_size, shuffle=True, seed=0):
        if X.shape[0] != y.shape[0]:
            raise ValueError(f"X has {X.shape[0]} rows but y has {y.shape[0]}")
        self.X, self.y, self.batch_size, self.shuffle = X, y, batch_size, shuffle
        self.generator = torch.Generator().manual_seed(seed)

    def __len__(self):
        return math.ceil(self.X.shape[0] / self.batch_size)

    def index_batches(self):
        """One epoch: a list of index tensors (on X's device), the last one possibly shorter."""
        n = self.X.shape[0]
        perm = torch.randperm(n, generator=self.generator) if self.shuffle else torch.arange(n)
        return list(perm.to(self.X.device).split(self.batch_size))   # one copy per epoch

    def __iter__(self):
        for idx in self.index_batches():
            yield self.X[idx], self.y[idx]


def _replica_loss(X, y, params):
    return loss(lenet(X, params), y).sum()


def replica_flat_grad(X, y, params):
    """(the replica's gradients as one flat tensor, its summed loss): forward and backward in
    one function, so that torch.compile sees (and fuses) both."""
    grads, l = torch.func.grad_and_value(_replica_loss, argnums=2)(X, y, params)
    return torch.cat([g.reshape(-1) for g in grads]), l


class FastDataParallel:
    """k replicas of LeNet whose parameters and gradients live in one flat buffer per device:
    `step(idx)` is Part II's train_batch on X[idx], fused (the options below)."""
    # `step(idx)` trains on the examples X[idx] of the resident data: the batch is split over the
    # devices exactly as `split_batch` does, the summed per-shard losses are backpropagated, the
    # flat gradients summed over devices as `allreduce` does, and every replica takes
    # `param -= lr * grad / batch_size`.
    # cuda_graph: None = capture the step as a CUDA graph when all replicas share one GPU (one
    #   graph per process: it does not span devices); True = insist; False = never. The first
    #   `warmup` steps of each batch size run eagerly on a side stream (real training steps), the
    #   next one is captured and every later one replayed.
    # compile=True: each replica's gradients from one torch.compile'd forward+backward
    #   (`replica_flat_grad`; `fused_flat_grad` when every replica is on a CPU), falling back to
    #   eager (with a warning) where compiling fails; each new batch size may compile again.
    # replica_streams=True (one GPU only): each replica's forward and backward on its own CUDA
    #   stream, so that replicas sharing a GPU run at the same time (inside the graph too).
    # group: a torch.distributed process group this process is one rank of: `step(idx)` trains on
    #   its `idx.tensor_split(world)[rank]` slice of the global batch (split again over
    #   `devices`), the flat gradients summed over the ranks with one all_reduce before the
    #   update (no CUDA graph then).

    def __init__(self, params, devices, lr, X, y, cuda_graph=None, warmup=3, compile=False,
                 replica_streams=False, group=None):
        self.devices, self.k = [torch.device(d) for d in devices], len(devices)
        self.flat_params, self.flat_grads, self.params = [], [], []
        for d in self.devices:   # flatten copies: each replica owns its storage, even on one device
            fp, fg, views = flat_replica(params, d)
            self.flat_params.append(fp)
            self.flat_grads.append(fg)
            self.params.append(views)
        # lr lives in a tensor per device that the step reads (a CUDA graph replays the reads, so
        # a schedule that sets `net.lr` each epoch takes effect; a float would be baked in)
        self._lr = [torch.tensor(float(lr), device=d) for d in self.devices]
        self.data = {d: (X.to(d), y.to(d)) for d in dict.fromkeys(self.devices)}
        one_gpu = len(self.data) == 1 and self.devices[0].type == "cuda"
        if cuda_graph and not one_gpu:
            raise ValueError("a CUDA graph needs every replica on one and the same GPU, got "
                             f"{[str(d) for d in self.devices]}")
        if cuda_graph and group is not None:
            raise ValueError("cuda_graph=True with a process group is not supported here: the "
                             "all_reduce runs outside a graph (use cuda_graph=None or False)")
        self.group = group
        self.use_graph = (one_gpu and group is None) if cuda_graph is None else bool(cuda_graph)
        self.warmup, self.graphs, self.seen = warmup, {}, Counter()
        self.side = torch.cuda.Stream(self.devices[0]) if self.use_graph else None
        # torch.cuda.graph's default capture stream is created once, on whatever device is current
        # then; capture on a stream of OUR GPU instead (it may not be the current device)
        self.capture_stream = torch.cuda.Stream(self.devices[0]) if self.use_graph else None
        if replica_streams and not one_gpu:
            raise ValueError("replica_streams needs every replica on one and the same GPU")
        self.streams = ([torch.cuda.Stream(self.devices[0]) for _ in range(self.k)]
                        if replica_streams else None)
        fused = (compile and all(d.type == "cpu" for d in self.devices)
                 and X.shape[-2:] == (28, 28))   # lenet_fused's crops are LeNet's on 28x28
        self.grad_fn = (_try_compile(fused_flat_grad, fallback=_plain_flat_grad) if fused
                        else _try_compile(replica_flat_grad) if compile else None)
        self._grad_params = tap_major if fused else list   # what grad_fn takes, made each step
        # what grad_fn differentiates: the same views, outside autograd's own recording
        self.plain = [[p.detach() for p in views] for views in self.params]

    @property
    def compiled(self):
        """True while the step runs torch.compile'd code (asked for, and no failure so far)."""
        return self.grad_fn is not None and not self.grad_fn.eager()

    @property
    def lr(self):
        return self._lr[0].item()

    @lr.setter
    def lr(self, value):
        for t in self._lr:   # in place: a captured graph reads these very tensors
            t.fill_(float(value))

    def _shards(self, idx):
        """This process's slice of the global batch idx (all of it without a group), split over
        the devices as split_batch does."""
        if self.group is not None:
            import torch.distributed as dist
            idx = idx.tensor_split(dist.get_world_size(self.group))[dist.get_rank(self.group)]
        return idx.tensor_split(self.k)

    def _step_eager(self, idx):
        if self.streams:
            return self._step_streams(idx)
        ls = []
        for c, (d, shard, params) in enumerate(zip(self.devices, self._shards(idx), self.params,
                                                   strict=True)):
            Xd, yd = self.data[d]
            shard = shard.to(d, non_blocking=True)
            if self.grad_fn:                           # forward and backward in one call
                g, l = self.grad_fn(Xd[shard], yd[shard], self._grad_params(self.plain[c]))
                self.flat_grads[c].copy_(g)
                ls.append(l)
            else:
                ls.append(_replica_loss(Xd[shard], yd[shard], params))
        if not self.grad_fn:
            torch.autograd.backward(ls)
        return self._reduce_and_update(ls, idx.numel())

    def _step_streams(self, idx):
        """_step_eager with replica c's forward (and so its backward) on stream c."""
        cur = torch.cuda.current_stream(self.devices[0])
        Xd, yd = self.data[self.devices[0]]
        ls = []
        for c, (s, shard, params) in enumerate(zip(self.streams, self._shards(idx),
                                                   self.params, strict=True)):
            s.wait_stream(cur)                        # fork: sees the batch and the last update
            with torch.cuda.stream(s):
                if self.grad_fn:
                    g, l = self.grad_fn(Xd[shard], yd[shard], self.plain[c])
                    self.flat_grads[c].copy_(g)
                    ls.append(l)
                else:
                    ls.append(_replica_loss(Xd[shard], yd[shard], params))
        if not self.grad_fn:
            torch.autograd.backward(ls)               # backward ops run on their forward's stream
        for s in self.streams:
            cur.wait_stream(s)                        # join before the allreduce reads the grads
        return self._reduce_and_update(ls, idx.numel())

    def _reduce_and_update(self, ls, batch_size):
        with torch.no_grad():
            allreduce(self.flat_grads)                # one allreduce of the flat gradients
            if self.group is not None:                # ... and one message between processes
                import torch.distributed as dist
                dist.all_reduce(self.flat_grads[0], group=self.group)
                for fg in self.flat_grads[1:]:
                    fg.copy_(self.flat_grads[0])
            for fp, fg, lr in zip(self.flat_params, self.flat_grads, self._lr, strict=True):
                fp.sub_(fg.mul(lr).div_(batch_size))   # = param -= lr * grad / batch_size
                fg.zero_()
        return sum(l.detach().to(self.devices[0]) for l in ls)

    def step(self, idx):
        """One SGD step on X[idx]; returns the summed loss on devices[0] (of this rank's slice
        with a group; with a CUDA graph: a static tensor that the next step overwrites, so use
        or copy it before then)."""
        if not self.use_graph:
            return self._step_eager(idx)
        n = idx.numel()
        if n in self.graphs:
            graph, static_idx, static_loss = self.graphs[n]
            static_idx.copy_(idx, non_blocking=True)
            graph.replay()
            return static_loss
        cur = torch.cuda.current_stream(self.devices[0])
        self.side.wait_stream(cur)
        if self.seen[n] < self.warmup:                 # warm up on a side stream, as the docs ask
            self.seen[n] += 1
            with torch.cuda.stream(self.side):
                out = self._step_eager(idx)
            cur.wait_stream(self.side)
            return out
        static_idx, graph = idx.clone(), torch.cuda.CUDAGraph()
        with torch.cuda.device(self.devices[0]), \
                torch.cuda.graph(graph, stream=self.capture_stream):
            static_loss = self._step_eager(static_idx)   # records the step, does not run it
        self.graphs[n] = (graph, static_idx, static_loss)
        graph.replay()                                 # now run this step for real
        return static_loss


def _try_compile(fn, fallback=None):
    """torch.compile(fn) where it works here, else `fallback` (default: fn itself, eagerly),
    which takes the same arguments. A failure on ANY call (the first compile, or a recompile for
    a new batch size) warns once and switches to the fallback for good; `wrapped.eager()` says
    whether that happened."""
    state, fallback = {"fn": None}, fallback or fn

    def wrapped(*args):
        if state["fn"] is fallback:
            return fallback(*args)
        try:
            if state["fn"] is None:
                state["fn"] = torch.compile(fn, dynamic=False)   # a graph per batch size
            return state["fn"](*args)
        except Exception as e:  # no compiler, unsupported platform or shape, ...: stay eager
            warnings.warn(f"torch.compile failed here ({type(e).__name__}: {str(e)[:120]}); "
                          "running eagerly from now on", stacklevel=2)
            state["fn"] = fallback
            return fallback(*args)
    wrapped.eager = lambda: state["fn"] is fallback
    return wrapped


def _plain_flat_grad(X, y, params):
    """`replica_flat_grad` from tap-major parameters: where `fused_flat_grad` cannot be compiled,
    the plain LeNet's arithmetic (bitwise what the uncompiled step computes)."""
    W1t, *rest = params
    return replica_flat_grad(X, y, [untap(W1t), *rest])


def flat_replica(params, device):
    """One replica on `device`: (flat parameters, flat gradients, views). The views are leaf
    tensors into the flat parameters, each with `.grad` a view into the flat gradients, so
    autograd accumulates into the flat buffer and one operation can reduce or update them all.
    `flatten` copies, so two replicas never share storage, even on one device."""
    fp = flatten([p.detach() for p in params]).to(device)
    fg, views, off = torch.zeros_like(fp), [], 0
    for p in params:
        m = p.numel()
        v = fp[off:off + m].view(p.shape).requires_grad_()
        v.grad = fg[off:off + m].view(p.shape)   # autograd accumulates into it, in place
        views.append(v)
        off += m
    return fp, fg, views


def resident_accuracy(params, X, y, chunk=2048):
    """Test accuracy of LeNet with `params` on resident tensors X, y (in chunks)."""
    return evaluate_accuracy(lambda X: lenet(X, params),
                             zip(X.split(chunk), y.split(chunk), strict=True), X.device)


def train_fast(num_gpus, batch_size, lr, num_epochs=10, subset=None, seed=0, cuda_graph=None,
               compile=False, replica_streams=False, plot=False, verbose=True):
    """Part II's experiment, fast: resident data, fused flat step, CUDA graph on one GPU, and
    with compile=True a torch.compile'd forward and backward (its first epoch pays the compile).

    Same model, initialisation (`seed`), optimizer and batch size as `train`; the data order is
    ResidentLoader's. Returns the same dict as `train` (test_acc, sec_per_epoch, epoch_times,
    params) plus `used_graph` and `compiled` (False where compiling failed and it ran eagerly).
    Like `train`, a last batch shorter than the device count is trained on (empty shards on some
    devices), and seed=None means a different run each time.
    """
    for name, v in dict(num_gpus=num_gpus, batch_size=batch_size, num_epochs=num_epochs).items():
        validate_positive_int(v, name)
    validate_positive_int(subset, "subset", allow_none=True)
    validate_lr(lr)
    if validate_seed(seed) is None:   # as train(seed=None): a fresh random start and data order
        seed = int(torch.randint(2 ** 62, ()))
    devices = get_devices(num_gpus)
    X, y = load_tensors(True, subset, devices[0])
    X_test, y_test = load_tensors(False, subset, devices[0])
    net = FastDataParallel(init_lenet_params(seed=seed), devices, lr, X, y,
                           cuda_graph=cuda_graph, compile=compile,
                           replica_streams=replica_streams)
    loader = ResidentLoader(X, y, batch_size, seed=seed)
    animator = Animator(xlabel="epoch", xlim=[1, num_epochs], ylim=[0, 2.5],
                        legend=["train loss", "test acc"]) if plot else None
    timer = Timer(devices)
    for epoch in range(num_epochs):
        timer.start()
        total_loss = torch.zeros((), device=devices[0])
        for idx in loader.index_batches():
            total_loss += net.step(idx)
        timer.stop()
        test_acc = resident_accuracy(net.params[0], X_test, y_test)
        if animator:
            animator.add(epoch + 1, (total_loss.item() / X.shape[0], test_acc))
    sec = timer.median(skip=1)
    if verbose:
        how = [w for w, on in (("CUDA graph", net.use_graph), ("compiled", net.compiled)) if on]
        print(f"{num_gpus} device(s), fast: test acc {test_acc:.3f}, {sec:.3f} s/epoch "
              f"on {[str(d) for d in devices]}" + (f" ({', '.join(how)})" if how else ""))
    return dict(num_gpus=num_gpus, test_acc=test_acc, sec_per_epoch=sec,
                epoch_times=timer.times, params=net.params[0], used_graph=net.use_graph,
                compiled=net.compiled)
