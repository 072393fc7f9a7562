"""The model, data and optimizer of a case of the wrappers' property test (tests/wrapper_cases.py
describes a case), and the one-process run every wrapper must equal."""
import torch
from torch import nn
from torch.nn import functional as F

from helpers.one_process import params_of


# ---- the model ---------------------------------------------------------------------------------
class TiedPair(nn.Module):
    """Two square layers sharing one weight (their biases are their own)."""

    def __init__(self, width):
        super().__init__()
        self.a, self.b = nn.Linear(width, width), nn.Linear(width, width)
        self.b.weight = self.a.weight

    def forward(self, h):
        return torch.tanh(self.b(torch.tanh(self.a(h))))


class Block(nn.Module):
    """One square layer of a given kind (see the module docstring)."""

    def __init__(self, width, kind):
        super().__init__()
        self.kind, self.lin = kind, nn.Linear(width, width)
        if kind == "frozen":
            self.lin.requires_grad_(False)

    def forward(self, h):
        if self.kind == "unused":
            return h
        h = torch.tanh(self.lin(h))
        return torch.tanh(self.lin(h)) if self.kind == "reused" else h


class PropNet(nn.Module):
    def __init__(self, case):
        super().__init__()
        w = case["width"]
        self.stem = nn.Linear(case["d_in"], w)
        self.blocks = nn.ModuleList(TiedPair(w) if k == "tied" else Block(w, k)
                                    for k in case["blocks"])
        self.head = nn.Linear(w, case["d_out"])

    def forward(self, x):
        h = torch.tanh(self.stem(x))
        for b in self.blocks:
            h = b(h)
        return self.head(h)


def build_net(case, seed=None):
    torch.manual_seed(case["seed"] if seed is None else seed)
    return PropNet(case)


def case_data(case):
    """X (num_steps, accum, world * batch, d_in) and y (num_steps, accum, world * batch)."""
    g = torch.Generator().manual_seed(case["seed"] + 1)
    rows = case["world"] * case["batch"]
    X = torch.randn(case["num_steps"], case["accum"], rows, case["d_in"], generator=g)
    y = torch.randint(0, case["d_out"], (case["num_steps"], case["accum"], rows), generator=g)
    return X, y


def param_groups(case, params):
    """The case's param groups over (name, parameter) pairs, trainable ones only."""
    named = [(n, p) for n, p in params if p.requires_grad]
    if case["optim"] != "adamw" or not case["groups"]:
        return [dict(params=[p for _, p in named])]
    return [dict(params=[p for _, p in named if p.dim() >= 2], weight_decay=0.1),
            dict(params=[p for _, p in named if p.dim() < 2], weight_decay=0.0)]


def optimizer_cls(case):
    """(class, keyword arguments) of the case's optimizer."""
    if case["optim"] == "sgd":
        return torch.optim.SGD, dict(lr=0.1)
    if case["optim"] == "momentum":
        return torch.optim.SGD, dict(lr=0.05, momentum=0.9)
    return torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1)


def make_optimizer(case, params):
    cls, kw = optimizer_cls(case)
    return cls(param_groups(case, params), **kw)


def loss_of(out, y, accum):
    return F.cross_entropy(out.float(), y) / accum


def one_process(case):
    """{name: tensor}: the model trained on the combined batches in one process."""
    net = build_net(case)
    opt = make_optimizer(case, net.named_parameters())
    X, y = case_data(case)
    for s in range(case["num_steps"]):
        for m in range(case["accum"]):
            loss_of(net(X[s, m]), y[s, m], case["accum"]).backward()
        opt.step()
        opt.zero_grad()
    return params_of(net)
