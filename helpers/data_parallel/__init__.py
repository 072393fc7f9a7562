"""Data parallelism: every device holds the whole model and a slice of the batch.

simulated (Part II, one process), allreduce (Part IV's variants and their cost), fast and
fast_lenet (Part IV's fast trainer), compiled_step (its torch.compile rival on one device),
scratch (DDPFromScratch across processes), torch_api (torch's DDP helpers, SyncBatchNorm).
The runs across processes (launch targets) sit in experiments and in *_experiments beside it:
scratch_ and overlap_ (Part III's wrapper), dp_vs_ddp_ (DataParallel against DDP on 2 GPUs),
fast_ and speed_ (Part IV's timed runs), syncbn_ (the syncbn chapter's cost and traffic); what
they return, in results. What the chapters draw and say
from these runs sits apart: schematics/ (the figures) and words/ (the sentences chosen by the
numbers, each branch tested).
"""
