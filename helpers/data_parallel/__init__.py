"""Data parallelism: every device holds the whole model and a slice of the batch.

simulated (Part II, one process), allreduce (Part IV's variants and their cost), fast and
fast_lenet (Part IV's fast trainer), scratch (DDPFromScratch across processes), torch_api
(torch's DDP helpers, SyncBatchNorm), experiments, scratch_experiments and overlap_experiments
(the runs across processes), dp_vs_ddp (Part III's DataParallel against DDP on 2 GPUs), speed
and syncbn_cost (Part IV's and the syncbn chapter's timed runs). What the chapters draw and say
from these runs sits apart: schematics/ (the figures) and words/ (the sentences chosen by the
numbers, each branch tested).
"""
