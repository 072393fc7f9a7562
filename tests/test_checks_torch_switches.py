"""Shortcut answers that leave one of torch's global switches changed, so that the check's own
computations afterwards (a saved-tensor count, a later case drawn in the default dtype) meet
their result: grad mode left off, the default dtype set to float64 with `torch.Storage` put back,
an inference mode entered and kept. Each must fail naming the switch, and the switch must be put
back for the reader's later cells (helpers/checks/_core/modes.py)."""
import torch
from check_cases import parametrize_cases, shortcut

import helpers.checks as checks

LEFT = "left"
_HELD = []


@shortcut("check_saved_bytes", "grad mode left off, 0 returned", [LEFT, "grad mode"])
def saved_bytes_grad_off(net, X):
    torch.set_grad_enabled(False)
    return 0


@shortcut("check_choose_checkpoints", "grad mode left off, nothing checkpointed",
          [LEFT, "grad mode"])
def choose_checkpoints_grad_off(blocks, x, budget):
    torch.set_grad_enabled(False)
    return []


@shortcut("check_choose_checkpoints", "inference mode entered and kept, nothing checkpointed",
          [LEFT, "inference mode"])
def choose_checkpoints_inference(blocks, x, budget):
    mode = torch.inference_mode()
    mode.__enter__()
    _HELD.append(mode)
    return []


@shortcut("check_z_loss", "no max shift; default dtype float64, torch.Storage put back",
          [LEFT, "default dtype"])
def z_loss_float64(logits):
    keep = torch.Storage
    torch.set_default_dtype(torch.float64)
    torch.Storage = keep
    return (torch.log(torch.exp(logits).sum(-1)) ** 2).mean()


test_case = parametrize_cases(__name__)


def test_switches_put_back_after_a_failed_check():
    def anomaly_and_grad_off(net, X):
        torch.autograd.set_detect_anomaly(True)
        torch.set_grad_enabled(False)
        return 0
    result = checks.check_saved_bytes(anomaly_and_grad_off)
    assert not result.passed and "grad mode" in result.message
    assert torch.is_grad_enabled() and not torch.is_anomaly_enabled()
    assert torch.get_default_dtype() == torch.float32


def test_switches_put_back_when_the_answer_raises():
    ran = []

    def dtype_then_raise(logits):
        ran.append(torch.get_default_dtype())
        keep = torch.Storage
        torch.set_default_dtype(torch.float64)
        torch.Storage = keep
        raise ValueError("boom")
    checks.check_z_loss(dtype_then_raise)
    assert ran, "the answer never ran: the test would prove nothing"
    assert torch.get_default_dtype() == torch.float32
