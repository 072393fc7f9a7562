"""A hook check_overlap_hooks keeps returns only what torch's autograd takes from it
(helpers/checks/_core/kept_hooks.py): replacement gradients from a tensor hook or a node's
pre-hook (a tuple) are the answer's to give and are judged as any answer; a post-accumulate-grad
hook's tensor or a node hook's bare tensor fails naming it, where it used to end in "the check
itself failed" (torch refused it inside the check's own backward)."""
import torch.distributed as dist
from check_cases import other, parametrize_cases, shortcut


def _node(p):
    """The parameter's AccumulateGrad node (kept alive by the caller, or its hooks go with it)."""
    return p.expand_as(p).grad_fn.next_functions[0][0]


def _reducing(model, on_node=None, returns=lambda p: None):
    """Each trainable parameter's gradient all-reduced from a post-accumulate-grad hook that
    returns `returns(p)`, `on_node(node)` run on its AccumulateGrad node; finish() waits and
    averages unless a node hook scaled the gradients already."""
    handles, nodes, world = [], [], dist.get_world_size()

    def hook(p):
        handles.append(dist.all_reduce(p.grad, async_op=True))
        return returns(p)
    for p in model.parameters():
        if p.requires_grad:
            if on_node is not None:
                nodes.append(_node(p))
                on_node(nodes[-1], world)
            p.register_post_accumulate_grad_hook(hook)

    def finish():
        for h in handles:
            h.wait()
        handles.clear()
        for p in model.parameters():
            if p.grad is not None and on_node is None:
                p.grad.div_(world)
    finish.nodes = nodes
    return finish


@shortcut("check_overlap_hooks", "its post-accumulate-grad hook returns the gradient",
          ["your hook `hook`", "register_post_accumulate_grad_hook, returned a tensor of shape",
           "takes None from such a hook", "Return nothing"])
def overlap_post_accumulate_returns_grad(model):
    return _reducing(model, returns=lambda p: p.grad)


@shortcut("check_overlap_hooks", "a node pre-hook returns a bare tensor, not a tuple",
          ["register_prehook, returned a tensor of shape", "grad_outputs (1 here)",
           "expected tuple, but hook returned 'Tensor'", "Return a tuple, (g,), or nothing"])
def overlap_prehook_returns_tensor(model):
    return _reducing(model, lambda node, world: node.register_prehook(lambda go: go[0] / world))


@shortcut("check_overlap_hooks", "a node pre-hook returns a gradient of another shape",
          ["register_prehook", "its value 0 is a tensor of shape", "where the gradient is"])
def overlap_prehook_flattens(model):
    return _reducing(model, lambda node, world: node.register_prehook(
        lambda go: (go[0].reshape(-1) / world,)))


@shortcut("check_overlap_hooks", "a node hook returns a bare tensor",
          ["registered on an autograd node with register_hook, returned a tensor",
           "grad_inputs (0 here)", "expected tuple"])
def overlap_node_hook_returns_tensor(model):
    return _reducing(model, lambda node, world: node.register_hook(
        lambda grad_inputs, grad_outputs: grad_outputs[0]))


@shortcut("check_overlap_hooks", "a tensor hook returns the gradient flattened",
          ["registered on a tensor with register_hook, returned a tensor of shape",
           "where the gradient is a tensor of shape", "the gradient's shape, dtype and device"])
def overlap_tensor_hook_flattens(model):
    def flatten(node, world):
        node.variable.register_hook(lambda g: g.reshape(-1) / world)
    return _reducing(model, flatten)


@other("check_overlap_hooks", "a node pre-hook returns the gradient divided by the world size "
       "(a tuple: replacement gradients), summed by the all-reduce")
def overlap_prehook_divides(model):
    return _reducing(model, lambda node, world: node.register_prehook(
        lambda go: (go[0] / world,)))


@other("check_overlap_hooks", "a tensor hook returns the gradient divided by the world size, "
       "summed by the all-reduce")
def overlap_tensor_hook_divides(model):
    def divide(node, world):
        node.variable.register_hook(lambda g: g / world)
    return _reducing(model, divide)


@other("check_overlap_hooks", "its post-accumulate-grad hook returns the parameter itself "
       "(torch takes it as None)")
def overlap_post_accumulate_returns_param(model):
    return _reducing(model, returns=lambda p: p)


test_case = parametrize_cases(__name__)
