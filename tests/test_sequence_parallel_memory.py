"""Sequence parallelism saves shards (helpers/tensor_parallel/sequence.py): on 2 and 4 thread
ranks the SPBlock equals the SmallBlock, and the activations autograd keeps per rank are exactly
Korthikanti's sequence-parallel count (helpers.activation_bytes_per_token(sp=True)), which
divides every replicated activation by t; the gathered input is gathered again in backward
instead of being kept."""
import pytest
import torch
from thread_ranks import run_threads

from helpers import (
    SPBlock,
    activation_bytes_per_token,
    block_inputs,
    block_loss,
    gather_shards,
    saved_tensor_bytes,
    small_block,
    sync_replicated_grads,
)


def _sp_rank(comm, block, X, R):
    m = SPBlock(block, comm)
    x = X.chunk(comm.world, 1)[comm.rank].clone().requires_grad_()
    saved, y = saved_tensor_bytes(m, x)
    block_loss(y, R.chunk(comm.world, 1)[comm.rank]).backward()
    sync_replicated_grads(m, comm)
    ops = [t.op for t in comm.traffic.records if t.op != "all_reduce"]
    return y.detach(), x.grad, {n: p.grad for n, p in m.named_parameters()}, saved, ops


@pytest.mark.parametrize("tp", [2, 4])
def test_sp_saves_the_planners_count_and_equals_the_block(tp):
    width, heads, batch, seq = 32, 4, 2, 8
    block = small_block(width=width, heads=heads)
    X, R = block_inputs(batch=batch, seq=seq, width=width)
    results, _ = run_threads(_sp_rank, tp, block, X, R)
    x = X.clone().requires_grad_()
    y = block(x)
    block_loss(y, R).backward()
    torch.testing.assert_close(torch.cat([r[0] for r in results], 1), y.detach())
    torch.testing.assert_close(torch.cat([r[1] for r in results], 1), x.grad)
    got = gather_shards([r[2] for r in results])
    for n, p in block.named_parameters():
        torch.testing.assert_close(got[n], p.grad, msg=n)
    want = activation_bytes_per_token(width, heads, seq, tp, True, "none", 4,
                                      flash=True) * batch * seq
    assert [r[3] for r in results] == [want] * tp
    gather, scatter = "all_gather", "reduce_scatter"
    assert results[0][4] == [gather, scatter] * 2 + [gather, gather, scatter] * 2
