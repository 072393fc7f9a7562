"""The output buffers of the World's gathers and reduce-scatters (dist.py): gloo and NCCL refuse
a buffer whose dtype or device is not the input's ("invalid tensor type"), so the World refuses
it too, naming the fix, where a plain copy would convert it (`torch.empty(n)` for a bfloat16
shard works here and fails on the cluster); `expect_dtype`: the checks' test that a result
came back in its input's dtype (a buffer converted by hand escapes the first)."""

from .run import expect

__all__ = ["copy_into", "copy_each", "expect_dtype"]


def _same(W, op, out, value):
    if out.dtype != value.dtype or out.device != value.device:
        W._refuse(W.rank, f"rank {W.rank}'s {op} writes its {value.dtype} input's values on "
                  f"{value.device} into a buffer of {out.dtype} on {out.device}: "
                  "torch.distributed refuses a buffer whose dtype or device is not the input's; "
                  "make it from the input (`t.new_empty(n)`, `torch.empty_like(t)`, "
                  "`t.new_zeros(n)`), not with torch.empty or torch.zeros' defaults")


def copy_into(W, op, out):
    """The delivery of a call that writes one buffer, `out` (the value reshaped to it)."""
    def deliver(value):
        _same(W, op, out, value)
        out.copy_(value.reshape(out.shape))
    return deliver


def copy_each(W, op, outs):
    """The delivery of a call that writes a list of buffers, `outs`, one value each."""
    def deliver(values):
        for out, value in zip(outs, values, strict=True):
            _same(W, op, out, value)
            out.copy_(value.reshape(out.shape))
    return deliver



def expect_dtype(got, dtype, what):
    """A result the check handed `dtype` tensors for must come back in `dtype` (a buffer made
    with torch.empty or torch.zeros' float32 default converts a bfloat16 shard)."""
    expect(got.dtype == dtype, f"{what} is {got.dtype} for a {dtype} input: make every buffer "
           "from the input (`t.new_empty(n)`, `t.new_zeros(n)`, `torch.empty_like(t)`), not "
           "with torch.empty or torch.zeros' float32 default")
