"""A reference compiled by torch before the check ran is the reference (tests/check_cases.py's
form): `torch.jit.script(ref)` (a TorchScript function, no Python bytecode) and
`torch.fx.symbolic_trace(ref)` (a GraphModule whose forward fx generated) held in a global are
refused like the reference itself (compiled.py: what torch records of its origin names the
function it was made from). The reader's own code scripted, traced or loaded by TorchScript is
refused too: its interpreter reads values out in C++ (prim::tolist), past every watched exit.
"""
import warnings

import torch
from check_cases import parametrize_cases, shortcut

import helpers

USES = "the course's own answer"

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    SCRIPTED = torch.jit.script(getattr(helpers, "router_" + "z_loss"))
    TRACED = torch.fx.symbolic_trace(getattr(helpers, "router_" + "z_loss"))


@shortcut("check_z_loss", "the reference compiled by torch.jit.script in a cell before", USES)
def z_loss_scripted_reference(logits):
    return SCRIPTED(logits)


@shortcut("check_z_loss", "the reference traced by torch.fx.symbolic_trace in a cell before", USES)
def z_loss_traced_reference(logits):
    return TRACED(logits)


def _own_z_loss(logits: torch.Tensor) -> torch.Tensor:
    m = logits.max(dim=-1, keepdim=True).values
    lse = m.squeeze(-1) + (logits - m).exp().sum(-1).log()
    return (lse * lse).mean()


with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    OWN = torch.jit.script(_own_z_loss)


@shortcut("check_z_loss", "the reader's own z-loss, scripted by torch.jit.script", "TorchScript")
def z_loss_own_scripted(logits):
    return OWN(logits)


@torch.jit.script
def _read_out(t: torch.Tensor) -> list[list[float]]:
    return t.tolist()


@shortcut("check_global_mean_var", "values read out by a TorchScript tolist", "TorchScript")
def global_mean_var_scripted_reads(counts, means, variances):
    n, m, v = counts.double(), _read_out(means), _read_out(variances)
    rows = [[float(x) for x in r] for r in m]
    mean = (n[:, None] * torch.tensor(rows, dtype=torch.float64)).sum(0) / n.sum()
    ex2 = (n[:, None] * (torch.tensor(v, dtype=torch.float64)
                         + torch.tensor(rows, dtype=torch.float64) ** 2)).sum(0) / n.sum()
    return mean.float(), (ex2 - mean ** 2).float()


@shortcut("check_global_mean_var", "torch.jit.script called while the answer runs",
          "TorchScript")
def global_mean_var_scripts_at_run_time(counts, means, variances):
    torch.jit.script(_own_z_loss)(means)
    n = counts.to(means.dtype)[:, None]
    mean = (n * means).sum(0) / n.sum()
    return mean, (n * (variances + (means - mean) ** 2)).sum(0) / n.sum()


test_case = parametrize_cases(__name__)


def test_the_origin_of_a_compiled_reference():
    from helpers.checks._core.compiled import compiled_origin
    from helpers.checks._core.references import identity
    ref = getattr(helpers, "router_" + "z_loss")
    assert compiled_origin(SCRIPTED) is ref and compiled_origin(TRACED) is ref
    assert identity(SCRIPTED) == identity(TRACED) == identity(ref)
    assert compiled_origin(OWN) is _own_z_loss and compiled_origin(ref) is None
