"""Tensor parallelism: each layer split within, its shards on different devices.

simulated (Part I: layer shards, ring collectives and Megatron's f/g over simulated devices),
with its pictures (schematics) and words (split_words); scratch (Part VI: f/g over a comm,
TPMLP, TPBlock); sequence (Part VI: sequence parallelism by hand, and the vocabulary split);
torch_api (DTensor plans); experiments (Part VI's runs, the 2-D mesh; what they return:
results).
"""
