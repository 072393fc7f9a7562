"""Data parallelism from scratch: copy parameters, split a batch, sum gradients (Part II)."""


def get_params(params, device):
    """Independent, trainable copies of `params` on `device`.

    Always copies, even when `device` is where `params` already live: `p.to(device)` on the same
    device returns the SAME tensor, and two "replicas" sharing storage double their gradients.
    """
    new_params = [p.detach().to(device, copy=True) for p in params]
    for p in new_params:
        p.requires_grad_()
    return new_params


def allreduce(data):
    """Sum a list of tensors (on any mix of devices) in place: afterwards each holds the sum.

    In place matters: the tensors are the replicas' `.grad`s. Rebinding a list item
    (`data[i] = data[0].to(...)`) would leave the replicas' own gradients unchanged.
    """
    if not data:
        raise ValueError("allreduce needs at least one tensor")
    for i in range(1, len(data)):
        data[0].add_(data[i].to(data[0].device))
    for i in range(1, len(data)):
        data[i].copy_(data[0])   # copy_ moves across devices and writes into data[i]'s storage


def split_batch(X, y, devices):
    """Split X and y into len(devices) paired shards, one on each device.

    Shard sizes differ by at most one (torch.tensor_split). A batch smaller than the number of
    devices (an epoch's short last batch) leaves some shards empty: those replicas add a zero
    gradient, and the sum over devices is still the whole batch's. `nn.parallel.scatter` would
    need CUDA.
    """
    k = len(devices)
    if k == 0:
        raise ValueError("no devices given: pass at least one, e.g. helpers.get_devices(1)")
    if X.shape[0] != y.shape[0]:
        raise ValueError(f"X has {X.shape[0]} examples but y has {y.shape[0]}; they must pair up")
    return ([x.to(d) for x, d in zip(X.tensor_split(k), devices)],
            [t.to(d) for t, d in zip(y.tensor_split(k), devices)])
