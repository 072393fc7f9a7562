"""The course's own answer to an exercise under another name: a function (or class) of the course
that solves it, called as it is or one piece of the input at a time (a layer), is refused like the
exercise's reference (tests/check_cases.py); each is in its check's `references=`."""
from check_cases import parametrize_cases, shortcut

import helpers

OWN = "course's own answer"


@shortcut("check_fit_copy_model", "Part IV's weighted fit, fit_alpha_beta, in GB/s", OWN)
def fit_copy_model_course_fit(nbytes, seconds):
    latency, bandwidth = helpers.fit_alpha_beta(nbytes, seconds)
    return latency, bandwidth / 1e9


@shortcut("check_time_it", "interleave of one function, its median", OWN)
def time_it_interleave(fn, devices, reps=5):
    return helpers.interleave({"fn": fn}, rounds=reps, warmup=0, devices=devices)["fn"].median


@shortcut("check_saved_bytes", "Part VI's LiveActivations, one micro-batch", OWN)
def saved_bytes_live_activations(net, X):
    tracker = helpers.LiveActivations()
    with tracker.micro_batch(list(net.parameters())) as mb:
        net(X)
    return mb.bytes


@shortcut("check_saved_bytes", "LiveActivations reached through its split's module", OWN)
def saved_bytes_live_activations_module(net, X):
    from helpers.pipeline_parallel.scratch import LiveActivations
    tracker = LiveActivations()
    with tracker.micro_batch(list(net.parameters())) as mb:
        net(X)
    return mb.bytes


def _padded(layer, world):
    n = sum(p.numel() for p in layer.parameters())
    return -(-n // world) * world


@shortcut("check_zero3_sent_bytes", "Part V's sharding_costs, one padded layer at a time", OWN)
def zero3_sent_bytes_sharding_costs(layers, world):
    return sum(helpers.sharding_costs(_padded(m, world), world, "zero3")["sent_bytes"]
               for m in layers)


@shortcut("check_zero3_sent_bytes", "Part VII's data_parallel_costs, one padded layer at a time",
          OWN)
def zero3_sent_bytes_data_parallel_costs(layers, world):
    return sum(helpers.data_parallel_costs(_padded(m, world), world, "zero3", 1, "every",
                                           "adam", 4)["sent_bytes"] for m in layers)


@shortcut("check_saved_bytes_of_call", "Part VI's LiveActivations, one micro-batch", OWN)
def saved_bytes_of_call_live_activations(f, *inputs):
    tracker = helpers.LiveActivations()
    with tracker.micro_batch(list(f.parameters())) as mb:
        f(*inputs)
    return mb.bytes


test_case = parametrize_cases(__name__)
