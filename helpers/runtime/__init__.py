"""Processes, process groups, messages and files: what every split runs on. Imports no split.

- launch: starting ranks (processes or threads); progress: how far they got;
- errors: how a run of ranks fails (RankFailed, LaunchTimeout, Deadlock);
- group: joining the process group; mesh: named dimensions into process groups;
- thread_world: ranks as threads, on a network that records every message (thread_waits:
  a send completes once received, a deadlock fails at once);
- comm: counted send/recv and collectives, over torch.distributed or threads;
- agree: ranks checked to run the same collectives;
- traffic: bytes sent, counted on one log; intercept: THE rebinding of torch.distributed's
  functions (count_traffic and the recordings of calls wrap them with it);
- files: the atomic writer; checkpoint: checkpoints and snapshots a crash cannot destroy;
- emulate: emulated durations for schedule lessons (real math, modelled time).
"""
