"""Part I's words for the within-layer split (the within_layer chapter): how the bytes it sends
at a batch compare with data parallelism's all-reduce, which does not grow with the batch, and
how the Megatron pairing's bytes compare with the column split's."""

__all__ = ["bytes_vs_dp_words", "paired_vs_column_words"]


def bytes_vs_dp_words(split_bytes, dp_bytes):
    """'more', 'less' or 'neither more nor less': the within-layer split's bytes per device and
    step against data parallelism's; the text goes on with 'than the ...'."""
    if split_bytes > dp_bytes:
        return "more"
    if split_bytes < dp_bytes:
        return "less"
    return "neither more nor less"


def paired_vs_column_words(paired_bytes, column_bytes):
    """How the Megatron pairing's bytes per example compare with the column split's (every layer
    split by outputs, pooled shards all-gathered): a clause after 'Paired the Megatron way, the
    split sends'. Where it sends more, the named cause is the one the counts contain: the row
    split all-reduces its output before the ReLU and pooling, the column chain moves only pooled
    shards."""
    share = f"{paired_bytes / column_bytes:.0%} of the column split's bytes"
    if paired_bytes > column_bytes:
        return (f"more, {share}: a row split must all-reduce its output whole, before the ReLU "
                "and pooling, where the column split moves only pooled shards")
    if paired_bytes < column_bytes:
        return f"less, {share}"
    return "as much as the column split"
