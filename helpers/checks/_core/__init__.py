"""The check harness: every `check_*` judges what the answer DID, observed from below, never
what it reports about itself.

run.py        run_check, Result, CheckFailed, HarnessError: one line for the reader, an exception
              for a grader, the blame on the answer or on the harness
declare.py    @check(exercise, observes=[...], references=[...]): the registry teachers.md and
              the tests read; the answer is called with the exercise's references blocked
              (compile_ready.py: torch.compile's one-time installs made before its snapshot)
settle.py     what an answer returns, settled before its call ends: no code of the reader's runs
              when the check converts or compares it
hooks.py      no hook the answer registered on what it was handed, or on the whole process,
              is left when it returns (the check goes on using those objects); early_hooks.py:
              nor may one of the reader's installed earlier be active when a check starts
modes.py      no torch switch (grad mode, default dtype, inference mode, ...) the answer changed
              is left changed when it returns
references.py no reference shortcut: the course's own answer is unreachable, by identity
              (compiled.py: a copy torch compiled, jit or fx, is the reference; reach.py: what
              an answer's code can reach, every object's class and what it holds walked)
own.py        the check modules' own functions (what a check computes its expected value with)
              run only for the check's own code while an answer runs
whose.py      whose code a code object is, by the code itself: one compiled under a library's
              or a check module's file name is the reader's
inputs.py     fresh inputs (replayed seeds in tests), numbers of any real type, tolerances from
              the expected computation's rounding (a half-precision number refused)
gradients.py  a result that exists for its gradient (a router's loss) judged by it too: a graph
              reaching the handed tensors, and the course's function's gradient
observe.py    Recorder: every aten op with its device, storages, dataflow, work and additions
              (cancels.py: an operand an op cancels, `x * 0`, `x - x`, flows nowhere)
guard.py      while an answer runs: no reading of other frames, no process, threads observed
              (early_threads.py: threads started before it refused; switches.py: torch's
              dispatch switches refused from the reader's code; carried.py: the modes its
              threads carry; operators.py: no operator of the reader's own, torch.library;
              marks.py: who started a thread, by identity, never an attribute of it;
              outlived.py: no thread or pool task of the answer's still running at its return)
fake.py       FakeGPUs: cuda:0..k-1 on any machine (placement, crossings, mixed devices)
              (cuda_calls.py, cuda_streams.py: torch.cuda's calls and streams on them;
              stream_races.py: no read of what another stream wrote, unwaited)
moved.py      what crossed between devices, and what each received of some inputs' data (flow.py:
              followed per range of a storage's bytes, spans.py, what a tensor covers, from its
              metadata; values.py: which reads hold the same values, `x / x` a constant)
same_work.py  the answer's run on FakeGPUs does the same torch work as its run on CPU tensors
              (no branch on the simulation)
world.py      World: the runtime's ThreadWorld (ranks as threads, a network that records every
              message) with dist.py playing torch.distributed for them, a Recorder per rank,
              allowed calls, and provenance.py: no tensor passes between ranks but by the comm
              (rank_numbers.py, rank_arrays.py: nor Python numbers or numpy arrays read out
              of a rank's tensors; outside.py: nor memory outside torch every rank wraps;
              early_views.py: nor a numpy view of a tensor taken before the ranks started);
              ledger.py: the World's records kept out of the answer's reach, and verified
              waits.py: every async call a rank launched waited for before the rank returns
exits.py      every way values leave torch without an aten operation (tolist, numpy, repr ...;
              storage_exits.py: a storage's own methods that read or write its memory in C;
              addresses.py: data_ptr(), whose storage stays exposed, and memory made from an
              address refused)
recorded.py   a recording net's guards: no work on its parameters beside its calls, and a step
              or gradient made from the backwards through its outputs (Taps)
numpy_work.py numpy's functions run on arrays while an answer runs (work no Recorder sees), for
              the checks that refuse that work in torch too
fresh.py      regrade: grading from a fresh import of the course (a patched check cannot score)
"""
# torch imports torch._dynamo lazily, at the first operation that asks whether it is being
# compiled (an optimizer's step, the checks' own dispatch modes). Inside a check that import would
# run under the guard and the recorders, which watch every step of it: ten times the import's own
# cost, in the first exercise of a kernel started afresh. So it is imported with the checks.
import torch._dynamo  # noqa: F401

# torch.func's first vmap registers its decompositions (a torch.library kernel, once per
# process): inside a check that reads as the answer registering a kernel of its own
# (left_later.py), so a right answer that is a process's first vmap would fail. Loaded here.
try:
    from torch._functorch.predispatch import lazy_load_decompositions
except ImportError:                 # a torch that loads them elsewhere (or eagerly)
    pass
else:
    lazy_load_decompositions()

# run.py first: it binds early_hooks.py's functions once its own names are defined, and
# early_hooks.py's imports (callbacks, hooks, settle) need those names, never the reverse
from . import run  # noqa: F401
from .declare import Answer, check
from .fake import FakeGPUs
from .inputs import (
                     as_int,
                     as_number,
                     as_pair,
                     fresh_generator,
                     gamma,
                     near,
                     number_words,
                     randint,
                     rel_close,
                     replay_seeds,
                     rounding_note,
                     same_number,
                     shown,
                     tensor_close,
                     tensor_equal,
                     uniform,
                     unit_roundoff,
)
from .observe import Op, Recorder, Ref, describe_device, storage_key
from .run import (
                     REGISTRY,
                     CheckFailed,
                     CheckInfo,
                     HarnessError,
                     ReferenceUsed,
                     Result,
                     expect,
                     grading,
                     is_reader_code,
                     run_check,
)
from .world import Message, World

__all__ = ["CheckFailed", "HarnessError", "Result", "run_check", "expect", "fresh_generator",
           "check", "REGISTRY"]
_ = (Answer, FakeGPUs, as_int, as_number, as_pair, gamma, near, randint, rel_close, replay_seeds,
     rounding_note, same_number, number_words, shown, tensor_close, tensor_equal, uniform,
     unit_roundoff, Op, Recorder, Ref, describe_device, storage_key, CheckInfo, ReferenceUsed,
     grading, is_reader_code, Message, World)
