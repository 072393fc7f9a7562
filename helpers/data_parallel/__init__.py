"""Data parallelism: every device holds the whole model and a slice of the batch.

simulated (Part II, one process), allreduce (Part IV's variants and their cost), fast (Part IV's
fast trainer), scratch (DDPFromScratch across processes), torch_api (torch's DDP helpers,
SyncBatchNorm), experiments (Part III's runs across processes), dp_vs_ddp (Part III's
DataParallel against DDP on 2 GPUs), speed (Part IV's timed runs).
"""
