"""What the harness knows of threads and calls it keeps itself: a check module's class handed
the answer's callable runs it as the answer's (no answer window may be open below the check's
frame), and who started a thread or which work was carried is noted by identity in the
harness's own registries (marks.py), never as attributes a reader's class drops or a cell
presets."""
import concurrent.futures as cf
import importlib
import queue
import threading
import types
from concurrent.futures.thread import _WorkItem

import torch
from check_cases import parametrize_cases, shortcut
from torch import nn

import helpers.checks

OWN = "the check's own"
OLD_MARKS = ("_course_started_by_answer", "_course_started_by_reader", "_course_carried",
             "_course_made_in_answer")


def _module(name):
    return importlib.import_module("helpers.checks." + name)


# --- a check module's class around the answer's callable ---------------------------------------
@shortcut("check_fit_copy_model", "runs the check's own fit through a check's class", OWN)
def fit_copy_model_through_a_checks_net(nbytes, seconds):
    best = getattr(_module("gpus"), "_best" + "_fit")
    return getattr(_module("data_parallel"), "_Recording" + "Net")(best)(nbytes, seconds)


@shortcut("check_z_loss", "runs the course's answer through a check's class",
          "the course's own answer")
def z_loss_through_a_checks_stage(logits):
    ref = getattr(importlib.import_module("helpers"), "router_z" + "_loss")

    class Stage(nn.Module):
        forward = staticmethod(ref)
    watched = getattr(_module("pipeline_dist"), "_Wat" + "ched")
    return watched(Stage(), types.SimpleNamespace(mark=len))(logits)


# --- a thread whose class drops what the harness would set on it -------------------------------
class _Deaf(threading.Thread):
    def __setattr__(self, name, value):
        if not name.startswith("_course_"):
            object.__setattr__(self, name, value)


@shortcut("check_idle_share", "calls the check's own function on a thread that drops marks", OWN)
def idle_share_on_a_thread_that_drops_marks(timelines):
    out = []
    worker = _Deaf(target=out.extend,
                   args=(map(getattr(_module("pipeline_dist"), "_bub" + "ble"), [timelines]),))
    worker.start()
    worker.join()
    return out[0]


@shortcut("check_idle_share", "calls the check's own function on a raw thread", OWN)
def idle_share_on_a_raw_thread(timelines):
    import _thread
    import heapq
    import time
    out = []
    _thread.start_new_thread(out.extend, (heapq.merge(map(
        getattr(_module("pipeline_dist"), "_bub" + "ble"), [timelines])),))
    for _ in range(500):
        if out:
            return out[0]
        time.sleep(0.01)
    raise RuntimeError("the thread gave nothing")


class _OwnLookup(threading.Thread):
    def __getattribute__(self, name):
        if name == "run":
            return types.MethodType(threading.Thread.run, self)
        return object.__getattribute__(self, name)


@shortcut("check_shard_sizes", "splits a tensor on a thread whose class keeps the watch out",
          "keeps the check's watch out")
def shard_sizes_on_a_thread_that_keeps_the_watch_out(n, k):
    out = []
    worker = _OwnLookup(target=lambda: out.append(
        [int(c.numel()) for c in torch.arange(n).tensor_split(k)]))
    worker.start()
    worker.join()
    return out[0]


test_case = parametrize_cases(__name__)


# --- marks preset on an earlier thread, or on the answer's own function -------------------------
def _measured(n, k):
    return [int(c.numel()) for c in torch.arange(n).tensor_split(k)]


def test_a_mark_preset_on_an_earlier_thread_does_not_hide_it():
    jobs = queue.Queue()

    def worker():
        for fn, args, box, done in iter(jobs.get, None):
            try:
                box.append(fn(*args))
            except BaseException as e:
                box.append(e)
            done.set()
    earlier = threading.Thread(target=worker, daemon=True)
    for name in OLD_MARKS:
        setattr(earlier, name, True)
    earlier.start()

    def shard_sizes(n, k):
        box, done = [], threading.Event()
        jobs.put((_measured, (n, k), box, done))
        done.wait(10)
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]
    try:
        result = helpers.checks.check_shard_sizes(shard_sizes)
    finally:
        jobs.put(None)
        earlier.join(10)
    assert result.status == "failed", result
    assert "a thread started before the check ran" in result.message, result.message


def test_a_carried_mark_on_the_answers_function_does_not_carry_it():
    pool = cf.ThreadPoolExecutor(1)
    pool.submit(int).result()           # its worker started now, before the answer

    def shard_sizes(n, k):
        def measured(n, k):
            return _measured(n, k)
        for name in OLD_MARKS:
            setattr(measured, name, True)
        done = cf.Future()
        pool._work_queue.put(_WorkItem(done, measured, (n, k), {}))
        return done.result(10)
    try:
        result = helpers.checks.check_shard_sizes(shard_sizes)
    finally:
        pool.shutdown(wait=True)
    assert result.status == "failed", result
    assert "handed to it through its executor's queue" in result.message, result.message
