"""Shortcut answers that change what the check handed them, so that the expected value the check
computes afterwards, from the same objects, meets their own result (tests/check_cases.py's form):
a tensor resized in place, a network's layers replaced, a module's forward reassigned, a weight
written through `.data` (no version counter sees it). Each must fail with the inputs named
(helpers/checks/_core/untouched.py); exercises that write into their inputs declare it
(`changes_inputs=True`) and keep their right answers passing."""
from check_cases import parametrize_cases, shortcut
from torch import nn

CHANGED = "changed its inputs"


@shortcut("check_tensor_bytes", "every input resized to 0 elements, 0 returned", CHANGED)
def tensor_bytes_resized(tensors):
    for t in tensors:
        t.resize_(0)
    return 0


@shortcut("check_split_by_params", "the net's layers replaced by Identity", CHANGED)
def split_by_params_emptied(net, devices):
    for i in range(len(net)):
        net[i] = nn.Identity()
    return [nn.Sequential(nn.Identity()).to(d) for d in devices]


@shortcut("check_saved_bytes", "the conv net's layers replaced by Identity, 0 returned", CHANGED)
def saved_bytes_emptied(net, X):
    for i in range(len(net)):
        net[i] = nn.Identity()
    return 0


@shortcut("check_saved_bytes_of_call", "the module's forward reassigned, 0 returned", CHANGED)
def saved_bytes_of_call_reassigned(f, x):
    f.forward = lambda *a: a[0] * 1.0
    return 0


@shortcut("check_saved_bytes", "a weight zeroed through .data (no version bump)", CHANGED)
def saved_bytes_zeroed_data(net, X):
    for p in net.parameters():
        p.data.zero_()
    return 0


test_case = parametrize_cases(__name__)
