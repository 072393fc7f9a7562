"""Results of the wrong shape, and torch's own copies of an exercise, each with the words its
refusal names (tests/check_cases.py's form):

1. a returned tensor of another shape: torch.allclose broadcasts, so an empty `t[None][:0]` was
   "close" to anything; every check compares tensors shape-first (tensor_close, tensor_equal);
2. torch's second copy of what an exercise asks for (ElasticDistributedSampler,
   `_replace_by_prefix`, context parallelism's merger and head-tail split, DTensor's,
   ShardedTensor's and functorch's chunk sizes), refused as the course's own answer is, by
   identity and while the answer runs;
3. a lookup table built at import with the forbidden split: a case beyond any table;
4. right answers written differently: a one-layer pipeline stage returned as the layer itself;
   torch's checkpoint_sequential, refused with its cause named (it leaves the last block plain).
"""
import copy
import importlib
import itertools

import pytest
import torch
from check_cases import other, parametrize_cases, shortcut
from torch.utils.checkpoint import checkpoint_sequential

from helpers.checks._core import CheckFailed, tensor_close, tensor_equal

SHAPE = "expected shape"
TORCH_COPY = "torch's copy of what the exercise asks for"


# ---- 1. a tensor of another shape --------------------------------------------------------------
@shortcut("check_ring_forward", "K/V go round the ring, an empty tensor comes back",
          ["rank 0's output has shape (0,", SHAPE])
def ring_forward_empty(q, k, v, comm):
    w, r = comm.world, comm.rank
    kv = torch.stack([k, v])
    for i in range(w - 1):
        comm.send(kv, (r + 1) % w, tag=i)
        kv = comm.recv((r - 1) % w, kv.shape, tag=i)
    comm.wait()
    return kv[0][None][:0]


@shortcut("check_merge_attention", "o merged, lse an empty tensor", ["lse has shape (0,", SHAPE])
def merge_attention_empty_lse(o1, lse1, o2, lse2):
    m = torch.maximum(lse1, lse2)
    w1, w2 = torch.exp(lse1 - m), torch.exp(lse2 - m)
    o = (o1 * w1[..., None] + o2 * w2[..., None]) / (w1 + w2)[..., None]
    return o, lse1[None][:0]


@shortcut("check_update_running_stats", "the running mean never updated, returned empty",
          ["running_mean has shape (0,", SHAPE])
def update_running_stats_empty_mean(running_mean, running_var, mean, var, n, momentum):
    new_var = (1 - momentum) * running_var + momentum * var * n / (n - 1)
    return running_mean[None][:0], new_var


@shortcut("check_update_running_stats", "the right values, one dimension too many",
          ["running_mean has shape (1,", SHAPE])
def update_running_stats_extra_dim(running_mean, running_var, mean, var, n, momentum):
    new_mean = (1 - momentum) * running_mean + momentum * mean
    new_var = (1 - momentum) * running_var + momentum * var * n / (n - 1)
    return new_mean[None], new_var


def test_tensor_close_is_shape_strict_and_names_the_shape():
    with pytest.raises(CheckFailed, match=r"shape \(0, 3\), expected shape \(3,\)"):
        tensor_close(torch.empty(0, 3), torch.ones(3))
    with pytest.raises(CheckFailed, match=r"shape \(1, 3\), expected shape \(3,\)"):
        tensor_equal(torch.ones(1, 3), torch.ones(3))
    with pytest.raises(CheckFailed, match="expected a tensor of shape"):
        tensor_close([1.0, 1.0, 1.0], torch.ones(3))


def test_tensor_close_compares_kinds_of_values_not_precisions():
    assert tensor_close(torch.ones(3), torch.ones(3, dtype=torch.float64))   # float32 vs 64
    assert tensor_equal(torch.arange(3, dtype=torch.int32), torch.arange(3))
    assert not tensor_close(torch.ones(3), torch.zeros(3))
    with pytest.raises(CheckFailed, match="integer values"):
        tensor_close(torch.ones(3, dtype=torch.int64), torch.ones(3))
    with pytest.raises(CheckFailed, match="boolean values"):
        tensor_equal(torch.ones(3, dtype=torch.bool), torch.ones(3, dtype=torch.int64))


def test_no_check_compares_with_torch_allclose_or_equal_directly():
    """Every comparison of a check goes through the shape-strict helpers."""
    import pathlib

    import helpers.checks
    root = pathlib.Path(helpers.checks.__file__).parent
    direct = [f"{p.name}:{i}" for p in sorted(root.glob("*.py"))
              for i, line in enumerate(p.read_text().splitlines(), 1)
              if "torch.allclose(" in line or "torch.equal(" in line]
    assert not direct, f"compare through tensor_close / tensor_equal: {direct}"


# ---- 2. torch's copy of the exercise -----------------------------------------------------------
@shortcut("check_sampler_shard", "torch's ElasticDistributedSampler, imported by name",
          ["ElasticDistributedSampler", "compute the shard yourself"])
def sampler_shard_elastic(n, rank, world_size, epoch, seed):
    from torch.distributed.elastic.utils.data import ElasticDistributedSampler
    s = ElasticDistributedSampler(range(n), num_replicas=world_size, rank=rank)
    s.set_epoch(seed + epoch)
    return list(s)


@shortcut("check_sampler_shard", "ElasticDistributedSampler reached by a name built at run time",
          ["ElasticDistributedSampler.__iter__", TORCH_COPY])
def sampler_shard_elastic_built(n, rank, world_size, epoch, seed):
    mod = importlib.import_module("torch.distributed.elastic.utils." + "data")
    s = getattr(mod, "Elastic" + "DistributedSampler")(range(n), num_replicas=world_size,
                                                       rank=rank)
    s.set_epoch(seed + epoch)
    return list(s)


@shortcut("check_strip_module_prefix", "torch.distributed.utils._replace_by_prefix",
          ["_replace_by_prefix", TORCH_COPY])
def strip_module_prefix_replace(state_dict):
    from torch.distributed.utils import _replace_by_prefix
    out = dict(state_dict)
    _replace_by_prefix(out, "module.", "")
    return out


@shortcut("check_strip_module_prefix", "_replace_by_prefix reached by a name built at run time",
          ["_replace_by_prefix", TORCH_COPY])
def strip_module_prefix_replace_built(state_dict):
    out = dict(state_dict)
    getattr(importlib.import_module("torch.distributed." + "utils"),
            "_replace_" + "by_prefix")(out, "module.", "")
    return out


@shortcut("check_dp_shard_sizes", "DTensor's Shard(0)._local_shard_size_and_offset",
          ["_local_shard_size_and_offset", TORCH_COPY])
def dp_shard_sizes_dtensor(batch_size, k):
    from torch.distributed.tensor.placement_types import Shard
    sizes = (Shard(0)._local_shard_size_and_offset(batch_size, k, i)[0] for i in range(k))
    return [n for n in sizes if n]


@shortcut("check_dp_shard_sizes", "ShardedTensor's chunk spec, get_split_size and its sibling",
          ["get_split_size", TORCH_COPY])
def dp_shard_sizes_sharding_spec(batch_size, k):
    mod = importlib.import_module("torch.distributed._shard.sharding_spec._internals")
    split = mod.get_split_size(batch_size, k)
    sizes = (mod.get_chunked_dim_size(batch_size, split, i) for i in range(k))
    return [n for n in sizes if n > 0]


@shortcut("check_dp_shard_sizes", "functorch's get_chunk_sizes (vmap's chunks)",
          ["get_chunk_sizes", TORCH_COPY])
def dp_shard_sizes_functorch(batch_size, k):
    from torch._functorch.vmap import get_chunk_sizes
    return get_chunk_sizes(batch_size, -(-batch_size // k))


@shortcut("check_merge_attention", "context parallelism's _SDPAMerger",
          ["_SDPAMerger", TORCH_COPY])
def merge_attention_sdpa_merger(o1, lse1, o2, lse2):
    mod = importlib.import_module(
        "torch.distributed.tensor.experimental._context_parallel._attention")
    merger = mod._SDPAMerger(False, seq_dim=-2)
    merger.step(o1, lse1, False)
    merger.step(o2, lse2, False)
    return merger.results()


@shortcut("check_zigzag_positions", "context parallelism's _HeadTailLoadBalancer",
          ["_HeadTailLoadBalancer", TORCH_COPY])
def zigzag_positions_head_tail(T, world, rank):
    mod = importlib.import_module(
        "torch.distributed.tensor.experimental._context_parallel._load_balancer")
    order = mod._HeadTailLoadBalancer(T, world, "cpu")._generate_indices()
    return order.reshape(-1).chunk(world)[rank].tolist()


@shortcut("check_zigzag_positions", "its sibling, the per-document head-tail load balancer",
          ["_PerDocumentHeadTailLoadBalancer", TORCH_COPY])
def zigzag_positions_per_document(T, world, rank):
    mod = importlib.import_module(
        "torch.distributed.tensor.experimental._context_parallel._load_balancer")
    order = mod._PerDocumentHeadTailLoadBalancer([[T]], world, "cpu")._generate_indices()[0]
    return order.view(world, -1)[rank].tolist()


def test_every_torch_copy_a_check_names_exists_in_this_torch():
    """A torch copy renamed by a torch upgrade would silently stop being refused."""
    from helpers.checks._core import REGISTRY
    from helpers.checks._core.references import TorchReference, resolve
    named = sorted({r for info in REGISTRY.values() for r in info.references
                    if r.startswith("torch.")})
    assert len(named) >= 6
    found = resolve(named)
    assert [ref.name for ref in found] == named
    assert all(isinstance(ref, TorchReference) and ref.key[0] == "code" for ref in found)


# ---- 3. a table built at import ----------------------------------------------------------------
_SIZES = {(n, k): [len(s) for s in torch.arange(n).tensor_split(k)]
          for n in range(64) for k in range(1, 9)}


@shortcut("check_shard_sizes", "a table of measured splits built at import", "KeyError")
def shard_sizes_table(n, k):
    return _SIZES[n, k]


# ---- 4. right answers written differently ------------------------------------------------------
@other("check_split_by_params", "the best cut by search, a one-layer stage as the layer itself")
def split_by_params_bare_layer(net, devices):
    sizes = [sum(p.numel() for p in m.parameters()) for m in net]
    k, L = len(devices), len(net)
    best = min((max(sum(sizes[a:b]) for a, b in zip((0, *c), (*c, L), strict=True)), c)
               for c in itertools.combinations(range(1, L), k - 1))[1]
    bounds = [0, *best, L]
    return [copy.deepcopy(net[a] if b - a == 1 else net[a:b]).to(d)
            for (a, b), d in zip(itertools.pairwise(bounds), devices, strict=True)]


@shortcut("check_split_by_params", "an empty nn.Sequential as a stage", "stage 0 is empty")
def split_by_params_empty_stage(net, devices):
    return [torch.nn.Sequential().to(devices[0]), *[copy.deepcopy(net).to(d)
                                                    for d in devices[1:2]],
            *[torch.nn.Identity().to(d) for d in devices[2:]]]


@shortcut("check_checkpointed_forward", "torch's checkpoint_sequential, one segment per block",
          ["checkpoint_sequential", "the last included"])
def checkpointed_forward_sequential(blocks, x):
    return checkpoint_sequential(blocks, len(blocks), x, use_reentrant=False)


test_case = parametrize_cases(__name__)
