"""Sharding the training state over data-parallel ranks: ZeRO-1/2 (zero), ZeRO-3 built by hand
(fsdp_scratch), torch's FSDP2 (torch_api), Part V's experiments across processes (experiments,
and knobs_experiments and variants_experiments beside it).
Builds on data_parallel (ZeRO is data parallelism with sharded state).
"""
# variants.py: ZeRO-R, ZeRO-Offload/Infinity and ZeRO++, costed (the ZeRO chapter).
# results.py: what the launch targets return, one frozen dataclass per experiment.
