"""Part IV's rival to the fast trainer: one device training the plain LeNet nn.Module with its
SGD step under torch.compile(mode="reduce-overhead"), what a reader would reach for instead
(scripts/bench.py's compile row)."""
import torch

from ..data import load_tensors
from ..devices import Timer
from ..models import init_lenet_params
from .fast import ResidentLoader
from .speed_experiments import lenet_module_from

__all__ = ["train_compiled"]


def train_compiled(batch_size, lr, num_epochs, subset=None, seed=0, backend=None):
    """torch.compile(mode='reduce-overhead') of one SGD step of the plain module, trained for
    `num_epochs` on `subset` images in ResidentLoader's order; returns dict(epoch_times,
    test_acc, note). On a GPU its CUDA graphs reuse their output memory: each step is marked as
    a new iteration (torch.compiler.cudagraph_mark_step_begin, as torch documents) and returns
    nothing, so no output of an earlier replay is read after the next one overwrote it (the
    first GPU run: "accessing tensor output of CUDAGraphs that has been overwritten by a
    subsequent run"). backend="eager": dynamo alone, no code generated (the quick CPU dry run:
    same step, same loop, seconds instead of a compile)."""
    from torch.nn import functional as F
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    X, y = load_tensors(True, subset, device)
    X_test, y_test = load_tensors(False, subset, device)
    net = lenet_module_from(init_lenet_params(seed=seed)).to(device)
    opt = torch.optim.SGD(net.parameters(), lr=lr)

    def step(Xb, yb):
        loss = F.cross_entropy(net(Xb), yb)
        loss.backward()
        opt.step()
        opt.zero_grad()   # set_to_none: no gradient buffer kept from one replay to the next

    compiled = (torch.compile(step, backend=backend) if backend else
                torch.compile(step, mode="reduce-overhead"))
    loader = ResidentLoader(X, y, batch_size, seed=seed)
    times = []
    for _ in range(num_epochs):
        with Timer([device]) as timer:
            for idx in loader.index_batches():
                torch.compiler.cudagraph_mark_step_begin()   # a new step: earlier outputs free
                compiled(X[idx], y[idx])
        times.append(timer.times[-1])
    with torch.no_grad():
        correct = sum(int((net(Xc).argmax(1) == yc).sum())
                      for Xc, yc in zip(X_test.split(2048), y_test.split(2048), strict=True))
    return dict(epoch_times=times, test_acc=correct / len(y_test),
                note=f"compiled ({backend} backend)" if backend else "")
