"""The checks of Part II's exercises (helpers/checks/scratch.py): the reference solutions pass, a
stub reports "not done", and typical wrong answers (an off-by-one split, an allreduce that rebinds)
fail with their message."""
import pytest
import torch

from helpers import allreduce, get_params, split_batch
from helpers.checks import check_allreduce_spread, check_evaluate_accuracy_multi, check_shard_sizes


# The reference solutions, as the notebook has them between the nbgrader markers.
def shard_sizes(n, k):
    ### BEGIN SOLUTION
    if n < k:
        raise ValueError(f"cannot split {n} examples over {k} devices: some would get none")
    q, r = divmod(n, k)
    return [q + 1] * r + [q] * (k - r)   # like torch.tensor_split: the first r shards get one more
    ### END SOLUTION


def allreduce_spread(data):
    ### BEGIN SOLUTION
    k = len(data)
    chunks = [t.view(-1).tensor_split(k) for t in data]   # chunks[i][j]: a view into data[i]
    for j in range(k):   # reduce-scatter: tensor j sums chunk j, on its own device
        for i in range(k):
            if i != j:
                chunks[j][j].add_(chunks[i][j].to(chunks[j][j].device))
    for j in range(k):   # all-gather: every tensor copies chunk j from its owner
        for i in range(k):
            if i != j:
                chunks[i][j].copy_(chunks[j][j])
    ### END SOLUTION


def evaluate_accuracy_multi(net, params, data_iter, devices):
    ### BEGIN SOLUTION
    replicas = [get_params(params, d) for d in devices]    # one copy per device
    correct = [torch.zeros((), device=d) for d in devices]  # counted where the shard is
    total = 0
    with torch.no_grad():
        for X, y in data_iter:
            X_shards, y_shards = split_batch(X, y, devices)
            for i, (W, X_shard, y_shard) in enumerate(zip(replicas, X_shards, y_shards)):
                correct[i] += (net(X_shard, W).argmax(dim=1) == y_shard).sum()
            total += y.numel()
    return sum(c.item() for c in correct) / total
    ### END SOLUTION


def stub(*args):
    raise NotImplementedError()


CHECKS = [(check_shard_sizes, shard_sizes), (check_allreduce_spread, allreduce_spread),
          (check_evaluate_accuracy_multi, evaluate_accuracy_multi)]
IDS = [c.__name__ for c, _ in CHECKS]


@pytest.mark.parametrize("check,solution", CHECKS, ids=IDS)
def test_reference_solution_passes(check, solution):
    for _ in range(5):   # fresh inputs every call: pass every time
        result = check(solution)
        assert result and result.status == "passed", result


@pytest.mark.parametrize("check,solution", CHECKS, ids=IDS)
def test_stub_reports_not_done(check, solution, capsys):
    result = check(stub)
    assert result.status == "not done" and not result
    assert "not done yet" in capsys.readouterr().out


@pytest.mark.parametrize("check,solution", CHECKS, ids=IDS)
def test_inputs_are_fresh(check, solution):
    """Two runs of a check use different inputs, so an answer cannot memorise them."""
    def signature(a):
        if isinstance(a, torch.Tensor):
            return a.tolist()
        if isinstance(a, (list, tuple)):
            return [signature(x) for x in a]
        if isinstance(a, torch.nn.Module):
            return signature(list(a.parameters()))
        if hasattr(a, "dataset"):
            return signature(list(a))
        return repr(a)

    runs = []
    for _ in range(2):
        seen = []
        check(lambda *args: (seen.append(signature(args)), solution(*args))[1])
        runs.append(seen)
    assert runs[0] and runs[0] != runs[1]


def test_checks_leave_torch_random_state_alone():
    """Checks draw from their own generator: the notebook's random numbers stay reproducible."""
    state = torch.get_rng_state()
    for check, solution in CHECKS:
        check(solution)
    assert torch.equal(state, torch.get_rng_state())


# --- shard_sizes -----------------------------------------------------------------------------
def test_shard_sizes_off_by_one():
    """The remainder all goes to the last shard: sizes 2,2,2,4 instead of 3,3,2,2."""
    r = check_shard_sizes(lambda n, k: [n // k] * (k - 1) + [n - n // k * (k - 1)])
    assert r.status == "failed" and "shard 0 has" in r.message and "expected" in r.message


def test_shard_sizes_like_chunk():
    """torch.chunk sizes (3,3,3,1 for 10 over 4) are not tensor_split's."""
    def chunk_sizes(n, k):
        sizes = [len(c) for c in torch.arange(n).chunk(k)]
        return sizes + [0] * (k - len(sizes))
    r = check_shard_sizes(chunk_sizes)
    assert r.status == "failed"
    assert "rows, expected" in r.message or "row, expected" in r.message


def test_shard_sizes_wrong_order_and_sum():
    r = check_shard_sizes(lambda n, k: sorted(shard_sizes(n, k)))
    assert r.status == "failed" and "larger shards first" in r.message
    r = check_shard_sizes(lambda n, k: [n // k] * k)
    assert r.status == "failed" and "sum to" in r.message


def test_shard_sizes_must_raise_value_error():
    def no_error(n, k):
        q, r = divmod(n, k)
        return [q + 1] * r + [q] * (k - r)
    r = check_shard_sizes(no_error)
    assert r.status == "failed" and "raise ValueError" in r.message

    def wrong_error(n, k):
        if n < k:
            raise IndexError("too few")
        return no_error(n, k)
    r = check_shard_sizes(wrong_error)
    assert r.status == "failed" and "raised IndexError" in r.message


def test_shard_sizes_constant():
    r = check_shard_sizes(lambda n, k: [3, 3, 2, 2])
    assert r.status == "failed"


# --- allreduce_spread ------------------------------------------------------------------------
def allreduce_spread_rebinding(data):
    """Right values, but all-gathers by rebinding the list items."""
    k = len(data)
    chunks = [t.view(-1).tensor_split(k) for t in data]
    for j in range(k):
        for i in range(k):
            if i != j:
                chunks[j][j].add_(chunks[i][j])
    for j in range(1, k):
        chunks[0][j].copy_(chunks[j][j])
    for i in range(1, k):
        data[i] = data[0].clone()


def test_allreduce_spread_rebinding_fails():
    r = check_allreduce_spread(allreduce_spread_rebinding)
    assert r.status == "failed" and r.message.startswith("tensor 1 was not updated in place: ")


def test_allreduce_spread_replacing_storage_fails():
    def replace_storage(data):
        total = sum(t.clone() for t in data)
        for t in data:
            t.data = total.clone()
    r = check_allreduce_spread(replace_storage)
    assert (r.status == "failed"
            and "was not updated in place: its storage was replaced" in r.message)


def test_allreduce_spread_even_chunks_only_fails():
    """Chunks of numel // k elements leave the remainder unreduced."""
    def even_only(data):
        k = len(data)
        m = data[0].numel() // k
        flat = [t.view(-1) for t in data]
        for j in range(k):
            for i in range(k):
                if i != j:
                    flat[j][j * m:(j + 1) * m].add_(flat[i][j * m:(j + 1) * m])
        for j in range(k):
            for i in range(k):
                if i != j:
                    flat[i][j * m:(j + 1) * m].copy_(flat[j][j * m:(j + 1) * m])
    r = check_allreduce_spread(even_only)
    assert r.status == "failed" and "holds wrong values" in r.message
    assert "does not divide by" in r.message


def test_allreduce_spread_doing_nothing_fails():
    r = check_allreduce_spread(lambda data: None)
    assert r.status == "failed" and "is unchanged" in r.message
    r = check_allreduce_spread(lambda data: [sum(data)] * len(data))   # returns instead of in place
    assert r.status == "failed" and "is unchanged" in r.message


def test_allreduce_spread_through_device_0_fails():
    """Part II's own allreduce gives the right values, but device 0 does every addition."""
    r = check_allreduce_spread(allreduce)
    assert r.status == "failed" and "device 0 did all" in r.message and "spread them" in r.message


def test_allreduce_spread_stack_and_sum_fails():
    """Stacking everything and summing it is the same funnel, written in one line."""
    def stacked(data):
        total = torch.stack(data).sum(dim=0)
        for t in data:
            t.copy_(total)
    r = check_allreduce_spread(stacked)
    assert r.status == "failed" and "device 0 did all" in r.message


def test_allreduce_spread_everyone_sums_everything_fails():
    """Balanced, but every device adds up the whole tensors: k times the work."""
    def everyone(data):
        sums = [t.clone() for t in data]
        for i, s in enumerate(sums):
            for j, t in enumerate(data):
                if i != j:
                    s.add_(t)
        for t, s in zip(data, sums):
            t.copy_(s)
    r = check_allreduce_spread(everyone)
    assert r.status == "failed" and "additions in all" in r.message
    assert "only its own chunk" in r.message


def test_allreduce_spread_chunks_summed_on_device_0_fails():
    """Chunk by chunk, but every chunk summed into device 0's memory."""
    def chunks_on_0(data):
        k = len(data)
        chunks = [t.view(-1).tensor_split(k) for t in data]
        for j in range(k):
            for i in range(1, k):
                chunks[0][j].add_(chunks[i][j])
        for i in range(1, k):
            data[i].copy_(data[0])
    r = check_allreduce_spread(chunks_on_0)
    assert r.status == "failed" and "device 0 did all" in r.message


# --- evaluate_accuracy_multi -----------------------------------------------------------------
def test_evaluate_accuracy_multi_unsplit_fails():
    """The one-device evaluation: right number, but nothing is split."""
    def unsplit(net, params, data_iter, devices):
        correct = total = 0
        for X, y in data_iter:
            correct += (net(X, params).argmax(1) == y).sum().item()
            total += len(y)
        return correct / total
    r = check_evaluate_accuracy_multi(unsplit)
    assert r.status == "failed" and "ran on whole batches" in r.message


def test_evaluate_accuracy_multi_shared_params_fails():
    """Split, but every shard runs with the one original set of parameters."""
    def shared(net, params, data_iter, devices):
        correct = total = 0
        for X, y in data_iter:
            for Xs, ys in zip(*split_batch(X, y, devices)):
                correct += (net(Xs, params).argmax(1) == ys).sum().item()
            total += len(y)
        return correct / total
    r = check_evaluate_accuracy_multi(shared)
    assert r.status == "failed" and "original parameters" in r.message


def test_evaluate_accuracy_multi_first_shard_only():
    def first_shard(net, params, data_iter, devices):
        correct = total = 0
        for X, y in data_iter:
            X_shards, y_shards = split_batch(X, y, devices)
            correct += (net(X_shards[0], params).argmax(1) == y_shards[0]).sum().item()
            total += len(y_shards[0])
        return correct / total
    r = check_evaluate_accuracy_multi(first_shard)
    assert r.status == "failed" and "only the first device's shard" in r.message


def test_evaluate_accuracy_multi_mean_of_batches():
    def mean_of_batches(net, params, data_iter, devices):
        replicas = [get_params(params, d) for d in devices]
        accs = []
        for X, y in data_iter:
            right = sum((net(Xs, W).argmax(1) == ys).sum().item()
                        for Xs, ys, W in zip(*split_batch(X, y, devices), replicas))
            accs.append(right / len(y))
        return sum(accs) / len(accs)
    r = check_evaluate_accuracy_multi(mean_of_batches)
    assert r.status == "failed" and "mean of the per-batch accuracies" in r.message


def test_evaluate_accuracy_multi_count_and_constant():
    def count(net, params, data_iter, devices):
        return sum((net(X, params).argmax(1) == y).sum().item() for X, y in data_iter)
    r = check_evaluate_accuracy_multi(count)
    assert r.status == "failed" and "the number of correct predictions" in r.message
    r = check_evaluate_accuracy_multi(lambda net, params, data_iter, devices: 0.25)
    assert r.status == "failed" and "expected" in r.message


def test_evaluate_accuracy_multi_must_not_train():
    def trains(net, params, data_iter, devices):
        with torch.no_grad():
            for p in params:
                p.zero_()
        return evaluate_accuracy_multi(net, params, data_iter, devices)
    r = check_evaluate_accuracy_multi(trains)
    assert r.status == "failed" and "changed the parameters" in r.message
