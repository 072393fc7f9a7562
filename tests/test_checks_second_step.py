"""Answers that keep state across calls are judged over several steps (check_overlap_hooks: what
finish() leaves behind meets the next backward, and what it still holds is counted), and
check_cuts_for_times' fixed case defeats the cuts nearest the time quantiles and the greedy ones
on every draw."""
import itertools

import torch.distributed as dist
from check_cases import other, parametrize_cases, shortcut

import helpers.checks


def _hook_each(model, hook):
    """`hook` after each trainable parameter's gradient is accumulated: the variants below differ
    in what the hook keeps and what finish() does with it, not in how they register."""
    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(hook)


# ---- overlap_hooks: a second step -------------------------------------------------------------
@shortcut("check_overlap_hooks", "pending handles never cleared: step 2 divides twice",
          "before waiting for it")
def overlap_hooks_pending_not_cleared(model):
    pending = []

    def hook(p):
        pending.append((p, dist.all_reduce(p.grad, async_op=True)))
    _hook_each(model, hook)

    def finish():
        for p, h in pending:
            h.wait()
            p.grad /= dist.get_world_size()
    return finish


@shortcut("check_overlap_hooks", "hooks registered again in finish(): two all-reduces a grad",
          "before waiting for it")
def overlap_hooks_added_per_finish(model):
    pending = []

    def install():
        for p in model.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(
                    lambda p: pending.append(dist.all_reduce(p.grad, async_op=True)))
    install()

    def finish():
        for h in pending:
            h.wait()
        pending.clear()
        for p in model.parameters():
            if p.grad is not None:
                p.grad /= dist.get_world_size()
        install()
    return finish


@other("check_overlap_hooks", "(param, handle) pairs popped until none is left")
def overlap_hooks_pairs_popped(model):
    pending = []

    def hook(p):
        pending.append((p, dist.all_reduce(p.grad, async_op=True)))
    _hook_each(model, hook)

    def finish():
        while pending:
            p, h = pending.pop()
            h.wait()
            p.grad /= dist.get_world_size()
    return finish


@shortcut("check_overlap_hooks", "(grad, handle) pairs never cleared: step 3 divides the same "
          ".grad tensors again", "what an earlier step left behind")
def overlap_hooks_grad_pairs_kept(model):
    pending = []

    def hook(p):
        pending.append((p.grad, dist.all_reduce(p.grad, async_op=True)))
    _hook_each(model, hook)

    def finish():
        for _, h in pending:
            h.wait()
        for grad, _ in pending:
            grad.div_(dist.get_world_size())
    return finish


@shortcut("check_overlap_hooks", "handles never cleared, every old one waited again: values "
          "right, memory grows each step", "clear the pending list in finish() every step")
def overlap_hooks_handles_kept(model):
    handles = []

    def hook(p):
        handles.append(dist.all_reduce(p.grad, async_op=True))
    _hook_each(model, hook)

    def finish():
        for h in handles:
            h.wait()
        for p in model.parameters():
            if p.grad is not None:
                p.grad.div_(dist.get_world_size())
    return finish


@shortcut("check_overlap_hooks", "futures that divide in then(), never cleared: values right, "
          "memory grows each step", "clear the pending list in finish() every step")
def overlap_hooks_futures_kept(model):
    futures = []

    def hook(p):
        work = dist.all_reduce(p.grad, async_op=True)
        futures.append(work.get_future().then(
            lambda f, g=p.grad: g.div_(dist.get_world_size())))
    _hook_each(model, hook)

    def finish():
        for f in futures:
            f.wait()
    return finish


@shortcut("check_overlap_hooks", "an object's handles never cleared (finish a bound method)",
          "clear the pending list in finish() every step")
def overlap_hooks_object_kept(model):
    class Overlap:
        def __init__(self):
            self.handles = []
            for p in model.parameters():
                if p.requires_grad:
                    p.register_post_accumulate_grad_hook(
                        lambda p: self.handles.append(dist.all_reduce(p.grad, async_op=True)))

        def finish(self):
            for h in self.handles:
                h.wait()
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.div_(dist.get_world_size())
    return Overlap().finish


@other("check_overlap_hooks", "an object's bound finish; the last step's handles let go at the "
       "next step's first hook")
def overlap_hooks_object(model):
    class Overlap:
        def __init__(self):
            self.handles, self.done = [], False
            for p in model.parameters():
                if p.requires_grad:
                    p.register_post_accumulate_grad_hook(self.hook)

        def hook(self, p):
            if self.done:                      # a new step: the last one's handles go
                self.handles, self.done = [], False
            self.handles.append((p, dist.all_reduce(p.grad, async_op=True)))

        def finish(self):
            for p, h in self.handles:
                h.wait()
                p.grad.div_(dist.get_world_size())
            self.done = True
    return Overlap().finish


@shortcut("check_overlap_hooks", "handles kept on finish itself (finish.pending), never cleared",
          "clear the pending list in finish() every step")
def overlap_hooks_function_attribute_kept(model):
    def finish():
        for h in finish.pending:
            h.wait()
        for p in model.parameters():
            if p.grad is not None:
                p.grad.div_(dist.get_world_size())
    finish.pending = []
    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(
                lambda p: finish.pending.append(dist.all_reduce(p.grad, async_op=True)))
    return finish


@other("check_overlap_hooks", "handles kept on finish itself, a new list every step")
def overlap_hooks_function_attribute(model):
    def finish():
        for h in finish.pending:
            h.wait()
        finish.pending = []
        for p in model.parameters():
            if p.grad is not None:
                p.grad.div_(dist.get_world_size())
    finish.pending = []
    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(
                lambda p: finish.pending.append(dist.all_reduce(p.grad, async_op=True)))
    return finish


@shortcut("check_overlap_hooks", "handles kept in a class attribute, never cleared",
          "clear the pending list in finish() every step")
def overlap_hooks_class_attribute_kept(model):
    class Overlap:
        pending = []                           # the class's own list, shared by its objects

        def hook(self, p):
            self.pending.append(dist.all_reduce(p.grad, async_op=True))

        def finish(self):
            for h in self.pending:
                h.wait()
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.div_(dist.get_world_size())
    overlap = Overlap()
    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(overlap.hook)
    return overlap.finish


# ---- cuts_for_times: the fixed case -----------------------------------------------------------
def _slowest(times, cuts):
    bounds = [0, *cuts, len(times)]
    return max(sum(times[a:b]) for a, b in itertools.pairwise(bounds))


@shortcut("check_cuts_for_times", "cut at the prefix sum nearest each time quantile",
          "slowest stage")
def cuts_nearest_quantiles(times, p):
    prefix, L = list(itertools.accumulate(times)), len(times)
    cuts = []
    for s in range(1, p):
        c = min(range(1, L), key=lambda i: abs(prefix[i - 1] - s * prefix[-1] / p))
        c = min(max(c, cuts[-1] + 1 if cuts else 1), L - (p - s))
        cuts.append(c)
    return cuts


@shortcut("check_cuts_for_times", "close each stage nearest the mean of what is left",
          "slowest stage")
def cuts_greedy_closest(times, p):
    L, cuts, start = len(times), [], 0
    for s in range(p - 1):
        target = sum(times[start:]) / (p - s)
        best, acc, at = None, 0.0, start + 1
        for i in range(start + 1, L - (p - 2 - s)):
            acc += times[i - 1]
            if best is None or abs(acc - target) < best:
                best, at = abs(acc - target), i
        cuts.append(at)
        start = at
    return cuts


@other("check_cuts_for_times", "every cut tried")
def cuts_brute_force(times, p):
    L = len(times)
    return list(min(itertools.combinations(range(1, L), p - 1),
                    key=lambda c: _slowest(times, c)))


test_case = parametrize_cases(__name__)


def test_cuts_heuristics_fail_every_draw():
    """The fixed case is in every call: the heuristics fail on each of several fresh draws."""
    for fn in (cuts_nearest_quantiles, cuts_greedy_closest):
        for _ in range(4):
            result = helpers.checks.check_cuts_for_times(fn)
            assert result.status == "failed", f"{fn.__name__} passed: {result}"
