"""The figures of the data-parallel chapters (Parts II to IV), each drawn from what the code that
runs the idea produced: bucket_schematics (DDP's buckets over the backward), dp_schematics
(nn.DataParallel's step), wrapper_schematics (what DDP puts around a module), torchrun_schematics
(the torchrun chapter), syncbn_schematics (SyncBatchNorm's traffic), profile_schematics and
scaling_schematics (Part IV's measured figures).
"""
