"""On the simulated GPUs, the values the answer's run on CPU tensors read out are replayed in
order (placeholders.py): a zero-skip guard takes the CPU run's branch there, and a wrong answer
with a sanity assert on a value it reads stays failed (a placeholder would have made the assert
fail, reported as the grader's limit, "not your answer")."""
import torch
from check_cases import other, parametrize_cases, shortcut


@other("check_reduce_then_broadcast", "a zero-skip guard: `if not g.any(): continue`")
def reduce_then_broadcast_skip_any(grads):
    total = grads[0].clone()
    for g in grads[1:]:
        if not g.any():
            continue
        total += g.to(total.device)
    for g in grads:
        g.copy_(total.to(g.device))


@other("check_reduce_then_broadcast", "a zero-skip guard on count_nonzero(g).item()")
def reduce_then_broadcast_skip_count(grads):
    total = grads[0].clone()
    for g in grads[1:]:
        if torch.count_nonzero(g).item() == 0:
            continue
        total += g.to(total.device)
    for g in grads:
        g.copy_(total.to(g.device))


@shortcut("check_sharded_server_step", "every device sums everything, behind a sanity assert",
          "never pulled")
def sharded_server_step_everyone_asserts(params, grads, devices, lr):
    total = sum(g.to(devices[0]) for g in grads)
    assert total.abs().sum().item() > 0, "gradients are all zero?"
    for p, d in zip(params, devices, strict=True):
        p.sub_(lr * total.to(d))


test_case = parametrize_cases(__name__)
