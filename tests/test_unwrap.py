"""helpers.unwrap, the one unwrapping of the course: every known wrapper (DataParallel, a course
wrapper marked `wraps_module`, torch.compile's `_orig_mod`), nested, and the checkpoints that use
it; a model whose own submodule is called `module` is left whole."""
import torch
from torch import nn

import helpers
from helpers.runtime import checkpoint


class Wrapper(nn.Module):
    """A course-style wrapper (DDPFromScratch, ZeRO): the model as `.module`."""

    wraps_module = True

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        return self.module(x)


def test_unwrap_reaches_the_model_through_every_wrapper():
    net = nn.Linear(3, 2)
    assert helpers.unwrap(net) is net
    assert helpers.unwrap(nn.DataParallel(net)) is net
    assert helpers.unwrap(Wrapper(net)) is net
    assert helpers.unwrap(torch.compile(net)) is net
    assert helpers.unwrap(torch.compile(Wrapper(nn.DataParallel(net)))) is net


class Encoder(nn.Module):
    """A reader's model, not a wrapper, whose first part happens to be called `module`."""

    def __init__(self):
        super().__init__()
        self.module = nn.Linear(3, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.module(x))


def test_unwrap_leaves_a_model_with_a_submodule_called_module_whole(tmp_path):
    net = Encoder()
    assert helpers.unwrap(net) is net
    assert helpers.unwrap(nn.DataParallel(net)) is net
    assert helpers.unwrap(torch.compile(Wrapper(net))) is net
    checkpoint.save_checkpoint(Wrapper(net), tmp_path / "c.pt")
    assert set(torch.load(tmp_path / "c.pt")) == {"module.weight", "module.bias", "head.weight",
                                                   "head.bias"}


def test_the_course_wrappers_are_marked():
    assert all(cls.wraps_module is True for cls in (helpers.DDPFromScratch, helpers.Zero2,
                                                   helpers.FSDPFromScratch))


def test_unwrap_leaves_a_non_module_attribute_alone():
    net = nn.Linear(3, 2)
    net.module = "not a module"
    assert helpers.unwrap(net) is net


def test_checkpoint_and_snapshot_unwrap_the_same_way(tmp_path):
    """A compiled, wrapped model saves and loads the plain model's keys (no "module.",
    no "_orig_mod.")."""
    torch.manual_seed(0)
    net = nn.Linear(3, 2)
    wrapped = torch.compile(Wrapper(net))
    checkpoint.save_checkpoint(wrapped, tmp_path / "c.pt")
    assert set(torch.load(tmp_path / "c.pt")) == {"weight", "bias"}
    other = nn.Linear(3, 2)
    checkpoint.load_checkpoint(Wrapper(other), tmp_path / "c.pt")
    assert torch.equal(other.weight, net.weight)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    checkpoint.save_snapshot(tmp_path / "s.pt", wrapped, opt, epoch=1)
    assert set(torch.load(tmp_path / "s.pt", weights_only=False)["model"]) == {"weight", "bias"}
