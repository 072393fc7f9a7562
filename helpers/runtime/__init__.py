"""Processes, process groups, messages and files: what every split runs on. Imports no split.

launch (starting ranks), group (joining the process group), comm (counted send/recv and
collectives over torch.distributed or threads), mesh (named dimensions into process groups),
traffic (bytes counted), checkpoint (files a
crash cannot destroy, snapshots), emulate (emulated
durations for schedule lessons: real math, modelled time).
"""
