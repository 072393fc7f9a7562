"""Part I's words for the within-layer split (the within_layer chapter): how the bytes it sends
at a batch compare with data parallelism's all-reduce, which does not grow with the batch."""

__all__ = ["bytes_vs_dp_words"]


def bytes_vs_dp_words(split_bytes, dp_bytes):
    """'more', 'less' or 'neither more nor less': the within-layer split's bytes per device and
    step against data parallelism's; the text goes on with 'than the ...'."""
    if split_bytes > dp_bytes:
        return "more"
    if split_bytes < dp_bytes:
        return "less"
    return "neither more nor less"
