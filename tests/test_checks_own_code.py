"""Whose code it is, for the checks: the check modules' own functions (what a check computes its
expected value with) are out of the answer's reach (own.py), and code the reader compiles under
a library's, a check module's or a frozen module's file name is the reader's all the same
(whose.py): it may not read the check's frames, run a blocked reference as the check's own
code, or stay on as "a library's" trace function."""
import importlib
import json
import pathlib
import sys
import types

import torch
from check_cases import parametrize_cases, shortcut

import helpers.checks
from helpers.checks._core import whose

OWN = "the check's own"


def _module(name):
    return importlib.import_module("helpers.checks." + name)


# --- the check modules' own functions ------------------------------------------------------------
@shortcut("check_idle_share", "calls the check's own expected value", OWN)
def idle_share_by_the_checks_bubble(timelines):
    return getattr(_module("pipeline_dist"), "_bub" + "ble")(timelines)


@shortcut("check_local_shape", "calls the check's own FSDP2 rows", OWN)
def local_shape_by_the_checks_rows(shape, split_dim, dp, tp, dp_rank):
    s = list(shape)
    if split_dim is not None:
        s[split_dim] //= tp
    s[0] = getattr(_module("mesh2d"), "_fsdp" + "_rows")(s[0], dp, dp_rank)
    return tuple(s)


@shortcut("check_fit_copy_model", "calls the check's own fit", OWN)
def fit_copy_model_by_the_checks_fit(nbytes, seconds):
    return getattr(_module("gpus"), "_best" + "_fit")(nbytes, seconds)


@shortcut("check_bucket_params", "calls the check's copy of the blocked reference", OWN)
def bucket_params_by_the_checks_copy(params, bucket_mb):
    return getattr(_module("ddp_scratch"), "_buc" + "kets")(params, bucket_mb)


@shortcut("check_idle_share", "calls the check's own function in a pool's thread", OWN)
def idle_share_by_the_checks_bubble_in_a_pool(timelines):
    import concurrent.futures
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(getattr(_module("pipeline_dist"), "_bub" + "ble"), timelines).result()


@shortcut("check_idle_share", "calls the check's own function as a thread's target", OWN)
def idle_share_by_the_checks_bubble_in_a_thread(timelines):
    import concurrent.futures
    import threading
    done = concurrent.futures.Future()
    item = concurrent.futures.thread._WorkItem(
        done, getattr(_module("pipeline_dist"), "_bub" + "ble"), (timelines,), {})
    worker = threading.Thread(target=item.run)
    worker.start()
    worker.join()
    return done.result()


@shortcut("check_idle_share", "runs a copy of the check's module", "a copy of the check's own")
def idle_share_by_a_copy_of_the_check(timelines):
    path = _module("pipeline_dist").__file__
    space = {"__name__": "helpers.checks.pipeline_copy", "__package__": "helpers.checks"}
    exec(compile(pathlib.Path(path).read_text(), "<copy>", "exec"), space)
    return space["_bubble"](timelines)


# --- code compiled under a name that is not the reader's ---------------------------------------
PEEK = ("def peek():\n"
        "    import sys\n"
        "    f = getattr(sys, '_get' + 'frame')(1)\n"
        "    while f is not None:\n"
        "        d = getattr(f, 'f_lo' + 'cals')\n"
        "        if 's' in d and 'v' in d and 'blocks' in d:\n"
        "            return d['s'], d['v']\n"
        "        f = getattr(f, 'f_ba' + 'ck')\n")


def _merge_from_the_checks_frame(name):
    space = {}
    exec(compile(PEEK, name, "exec"), space)
    s, v = space["peek"]()
    return s.softmax(-1) @ v, torch.logsumexp(s, -1)


@shortcut("check_merge_attention", "reads the frames from code named a library's",
          "inspects the running program")
def merge_attention_named_json(o1, lse1, o2, lse2):
    return _merge_from_the_checks_frame(json.__file__)


@shortcut("check_merge_attention", "reads the frames from code named a frozen module's",
          "inspects the running program")
def merge_attention_named_frozen(o1, lse1, o2, lse2):
    return _merge_from_the_checks_frame("<frozen importlib._mine>")


@shortcut("check_merge_attention", "reads the frames through a traceback printer of its own",
          "inspects the running program")
def merge_attention_named_traceback(o1, lse1, o2, lse2):
    import traceback
    space = {}
    exec(compile(PEEK.replace("def peek", "def print_exc").replace("(1)", "(2)"),
                 traceback.__file__, "exec"), space)
    s, v = space["print_exc"]()
    return s.softmax(-1) @ v, torch.logsumexp(s, -1)


@shortcut("check_z_loss", "calls the reference through a wrapper named a check module's",
          "router_z_loss")
def z_loss_through_a_check_named_wrapper(logits):
    ref = getattr(importlib.import_module("help" + "ers"), "router_z" + "_loss")
    space = {}
    exec(compile("def call(f, *a):\n    return f(*a)\n", _module("expert_parallel").__file__,
                 "exec"), space)
    return space["call"](ref, logits)


test_case = parametrize_cases(__name__)


# --- plain tests -------------------------------------------------------------------------------
TRACER = '''
def _line(frame, event, arg):
    if event == "line":
        loc = frame.f_locals
        if "want" in loc and "got" in loc and loc["got"] != loc["want"]:
            loc["got"] = loc["want"]
    return _line

def _tracer(frame, event, arg):
    if event == "call" and frame.f_code.co_name == "check_gpipe_time":
        return _line
    return None
'''


def test_a_tracer_named_a_librarys_is_taken_off():
    """A trace function compiled under json's file name, set before the check, is the reader's:
    taken off and refused (it would set the check's `got` to its `want`)."""
    space = {}
    exec(compile(TRACER, json.__file__, "exec"), space)
    sys.settrace(space["_tracer"])
    try:
        result = helpers.checks.check_gpipe_time(lambda t_stage, p, m: t_stage * p)
    finally:
        sys.settrace(None)
    assert result.status == "failed" and "a trace function of yours" in result.message, result


def test_whose_code_is_decided_by_the_code():
    """A library's own code is genuine; the same name compiled from other source is not; the
    interpreter's frozen modules' own code is, a `<frozen ...>` name alone is not."""
    assert not whose.reader_code(json.dumps.__code__)
    assert not whose.reader_code(importlib.import_module("os").getenv.__code__)
    forged = compile("def dumps(obj):\n    return 1\n", json.__file__, "exec")
    inner = next(c for c in forged.co_consts if isinstance(c, types.CodeType))
    assert whose.reader_code(inner)
    assert whose.reader_code(compile("x = 1", "<frozen os>", "exec"))
    assert whose.reader_code(compile("x = 1", json.__file__ + "-not-there.py", "exec"))


def test_the_check_can_still_call_its_own_functions():
    """Outside an answer, and from the check's own code, the gated functions run as before."""
    rows = _module("mesh2d")._fsdp_rows
    assert rows.__code__.co_name == "_gate"      # gated (own.py), and still right
    assert [rows(10, 3, r) for r in range(3)] == [4, 4, 2]
