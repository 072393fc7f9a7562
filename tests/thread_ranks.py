"""Thread ranks for tests of code written against a comm, fn(comm, *args): the runtime's
ThreadWorld run directly (the course's own way to run a launch target on threads is
helpers.launch(fn, world, cfg, threads=True)); the first exception a rank raised comes back as it
was raised, so a test can expect it."""
from helpers.runtime.thread_world import ThreadWorld


def run_threads(fn, world, *args, timeout=5.0, record=False):
    """fn(comm, *args) on `world` thread ranks; (results, comms) in rank order. record=True:
    (results, comms, the world, which keeps every message: the comms hold no reference to it)."""
    w = ThreadWorld(world, timeout, deadline=timeout * 4 + 30, record=record)
    results = w.run(fn, *args)
    comms = [w.comm(r) for r in range(world)]
    return (results, comms, w) if record else (results, comms)
