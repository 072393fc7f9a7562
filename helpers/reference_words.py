"""Sentences that set the GPU reference run's figures (helpers.reference) beside a model's or this
machine's: the GPU chapter's fixed cost of a call and its roofline, and the costs chapter's LeNet
step. Every
branch has its words, and a figure no GPU has measured is called a prediction."""

__all__ = ["speed_words", "fixed_cost_words", "memory_roof_words", "measured_step_words",
           "call_vs_box_words"]


def speed_words(speed):
    """'faster than' / 'slower than' / 'as fast as', for a speed relative to one device (a model's
    ratio: no spread, so equality is its own branch)."""
    if speed > 1:
        return "faster than"
    if speed < 1:
        return "slower than"
    return "as fast as"


def fixed_cost_words(copy_s=None, flops_per_s=None, where=None, rounds=1):
    """The GPU's fixed cost of a call, without a period: `copy_s` the seconds a call of a 1 KiB
    copy took in the GPU reference run (`where`: its GPU and date), the median of `rounds`
    rounds of ten calls (1: one reading), `flops_per_s` its measured large-product rate (the
    work those seconds could have done). None: a prediction."""
    if not copy_s:
        return ("A call costs microseconds on a GPU too (a prediction: a kernel launch takes "
                "microseconds, however little the kernel does), time in which a GPU could have "
                "done a great deal of arithmetic")
    if copy_s <= 0 or (flops_per_s is not None and flops_per_s <= 0):
        raise ValueError(f"a time and a rate must be > 0, got {copy_s} s and {flops_per_s} FLOP/s")
    how = "one reading" if rounds == 1 else f"the median of {rounds} rounds"
    text = (f"A call costs microseconds on a GPU too: in the GPU reference run ({where}), ten "
            f"copies of 1 KiB inside the GPU's memory, issued back to back, took "
            f"{copy_s * 1e6:.1f} µs a call on the GPU's own clock (CUDA events; {how}, of "
            "one size). Calls this short measure how fast the host issues them (see the CUDA "
            "events below)")
    if flops_per_s:
        text += (f". In those {copy_s * 1e6:.1f} µs the GPU could have done about "
                 f"{copy_s * flops_per_s / 1e9:.2g} GFLOP of arithmetic, at the "
                 f"{flops_per_s / 1e12:.0f} TFLOP/s of a large float32 product in the same run")
    return text


def memory_roof_words(share, set_by_it):
    """Where the addition sits against the memory roof, appended to "... of the peak": `share` its
    FLOP/s over what the roof allows; `set_by_it` when the roof is its own pass (the faster of
    the two measured), so that it sits on the roof by construction, not as a finding."""
    if set_by_it:
        return "; it set the memory roof itself (the faster of the two passes over memory)"
    if not 0 < share:
        raise ValueError(f"a share of the roof must be > 0, got {share}")
    return f" and {share:.0%} of what the memory roof allows"


def measured_step_words(model_s, speed_model, step=None, speed_measured=None):
    """The costs chapter's check of LeNet's one-device step: `model_s` the model's step at a
    large product's rate (a lower bound: small layers reach far less of it), `speed_model` data
    parallelism's speed-up at that rate; `step` helpers.one_gpu_step() (None: no GPU run measured
    it) and `speed_measured` the model's speed-up with its compute set to the measured step."""
    if step is None:
        return (f"No GPU run has measured LeNet's step yet, so this verdict holds only at that "
                f"rate, and the model's {model_s * 1e3:.3f} ms is a lower bound on the step")
    if speed_measured is None:
        raise ValueError("pass speed_measured: the model's speed-up at the measured step")
    times = step["seconds"] / model_s
    how = f"{step['note']}, " if step.get("note") else ""   # in words: no row's identifier
    same = (speed_measured > 1) == (speed_model > 1) and (speed_measured < 1) == (speed_model < 1)
    turn = ("the same verdict as at the large product's rate" if same else
            "the opposite verdict: in the model, a longer backward hides more of the all-reduce")
    return (f"The GPU reference run measured LeNet's one-GPU step, with the fastest of Part IV's "
            f"one-GPU trainers ({how}batch {step['batch']}, {step['gpu']}), at "
            f"{step['seconds'] * 1e3:.3f} ms, "
            f"{times:.1f} times the model's {model_s * 1e3:.3f} ms. At the measured step, the "
            f"model's data parallelism would be {speed_words(speed_measured)} one device "
            f"({speed_measured:.2f} times its speed; the model shrinks each device's compute "
            f"with its share of the batch, so this is an upper bound if, as the GPU chapter's "
            f"fixed cost per call predicts, kernels this small do not shrink with it: a "
            f"prediction, not measured here), {turn}")


def call_vs_box_words(box_s, call_s=None, where=None):
    """After "the per-call cost of every operation in it": a call's cost on a GPU against the
    emulated schedule's longest box (`box_s`, its multiply-adds at a large product's rate):
    `call_s` a 1 KiB copy's call in the GPU reference run (`where`: its GPU and date), longer
    than the box, a share of it, or a small share; None: no GPU run measured one."""
    if not call_s:
        return (" (the GPU chapter measures one on this machine; no GPU run has recorded a "
                "GPU's yet, so how it compares with the box is not known here)")
    if call_s <= 0 or box_s <= 0:
        raise ValueError(f"times must be > 0, got a call of {call_s} s and a box of {box_s} s")
    r = call_s / box_s
    if r >= 1:
        cmp = f"{r:.1f} times the box's modelled length"
    elif r >= 0.1:
        cmp = f"{r:.0%} of the box's modelled length"
    else:
        cmp = f"only {r:.0%} of the box's modelled length"
    return (f": in the GPU reference run ({where}) one call, a copy of 1 KiB inside the GPU's "
            f"memory, took {call_s * 1e6:.1f} µs (CUDA events), {cmp}")
