"""Processes, process groups, messages and files: what every split runs on. Imports no split.

launch (starting ranks, processes or threads), group (joining the process group), thread_world
(ranks as threads, on a network that records every message), comm (counted send/recv and
collectives over torch.distributed or threads), agree (ranks checked to run the same
collectives), errors (how a run of ranks fails), progress (how far the ranks got), mesh (named
dimensions into process groups), traffic (bytes counted), files (the atomic writer),
checkpoint (files a crash cannot destroy, snapshots), emulate (emulated durations for schedule
lessons: real math, modelled time).
"""
