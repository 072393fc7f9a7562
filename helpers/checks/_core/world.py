"""The harness's world of ranks: the runtime's ThreadWorld (helpers/runtime/thread_world.py, the
one thread world `launch(..., threads=True)` runs on), whose network records every message, so
a check sees what travelled between whom instead of trusting what the answer reports.

    world = World(3, record_ops=True)
    results = world.run(fn, X)            # fn(comm, X) on each rank, comm = world.comm(rank),
                                          # a runtime ThreadComm
    results = world.launch(fn, cfg)       # fn(rank, world_size, cfg), cfg["comm"]: the
                                          # launcher's threads mode
    world.messages                        # every send, recv and collective call, in order
    World(3, allow={"all_reduce"})        # any other call (send, all_gather ...) fails the
                                          # answer (CheckFailed); barriers are always allowed

What the checks' World adds to the ThreadWorld, through its hooks:
- while `run`/`launch` runs, `torch.distributed` is this world too (dist.py): `dist.all_reduce`,
  `dist.reduce_scatter` (list or tensor form), `dist.all_gather`, `isend`/`irecv`, groups, async
  handles;
- with `record_ops`, each rank's aten operations are recorded (`world.recorders[rank]`);
- `allow`: the calls an exercise permits;
- provenance (provenance.py): a rank that touches a tensor another rank made or wrote, or one the
  check handed to another rank, other than through the network, fails the answer: thread ranks
  share one process, so a module global or a closure list could otherwise carry data past the
  comm that a check judges (outside.py: so could one numpy array every rank wraps); and
  rank_numbers.py and rank_arrays.py: a rank that uses or returns Python numbers or numpy
  arrays another rank read out of its tensors (.item(), .tolist(), .numpy(), .shape) fails too,
  in torch, in numpy, math and statistics, and as the shape of a recv.
"""
import contextlib

from ...runtime.thread_world import Message, ThreadWorld, Work
from .observe import Recorder
from .provenance import Provenance
from .rank_numbers import TagWatch, foreign_in, foreign_message
from .run import CheckFailed

__all__ = ["World", "Message", "Work"]


class World(ThreadWorld):
    """`size` thread ranks whose network the check reads (see the module's docstring)."""

    def __init__(self, size, timeout=10.0, record_ops=False, allow=None):
        super().__init__(size, timeout)
        self.record_ops = record_ops
        self.allow = None if allow is None else frozenset(allow) | {"barrier", "recv"}
        self.recorders = [None] * size
        self.provenance = Provenance(self)

    def run_context(self):
        from .dist import torch_distributed
        stack = contextlib.ExitStack()
        stack.enter_context(torch_distributed(self))
        stack.enter_context(self.provenance.python_exits())
        return stack

    def rank_context(self, rank):
        stack = contextlib.ExitStack()
        stack.enter_context(self.provenance.mode(rank))
        stack.enter_context(TagWatch(rank))
        if self.record_ops:
            self.recorders[rank] = stack.enter_context(Recorder())
        return stack

    def start(self, body):
        """As ThreadWorld.start; a rank whose result holds numbers that only other ranks read
        out of torch (rank_numbers.py) fails."""
        results, errors, stuck = super().start(body)
        if not errors and not stuck:
            for r, result in enumerate(results):
                others = foreign_in(result, r, self.provenance.exited_last)
                if others:
                    errors = [(r, CheckFailed(foreign_message(r, others, "returned")), "")]
                    break
        return results, errors, stuck

    def recv(self, src, tag=0, out=None, shape=None, dtype=None):
        """As ThreadWorld.recv; a shape made of another rank's numbers (a count it read out and
        left in a shared object) fails: how much arrives is something the comm tells."""
        rank = self.rank
        if rank is not None and shape is not None:
            others = foreign_in(list(shape), rank, {})
            if others:
                raise CheckFailed(foreign_message(rank, others, "sized a recv with"))
        return super().recv(src, tag, out=out, shape=shape, dtype=dtype)

    def comm_context(self):
        return self.provenance.network()

    def allowed(self, op):
        """Refuse, in the calling rank, a call the exercise does not allow: a substitute for the
        collective it is about (an all_gather beside a decoy all_reduce) moves the data the
        exercise asks for in another way."""
        if self.allow is not None and op not in self.allow:
            raise CheckFailed(f"rank {self.rank} called {op}: this exercise allows only "
                              f"{', '.join(sorted(self.allow - {'barrier', 'recv'}))} to move "
                              "data between the ranks")
