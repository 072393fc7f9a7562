

def test_plural_agrees_with_its_count():
    """Printed counts read '1 rank', '2 ranks', never '1 ranks' or 'rank(s)'."""
    from helpers.words import plural
    assert plural(1, "rank") == "1 rank"
    assert plural(2, "rank") == "2 ranks"
    assert plural(0, "sample") == "0 samples"
    assert plural(1, "process") == "1 process"
    assert plural(4, "process") == "4 processes"
    assert plural(2, "batch") == "2 batches"
    assert plural(3, "epoch") == "3 epochs" and plural(2, "coach") == "2 coaches"
    assert plural(2048, "byte") == "2,048 bytes"
    assert plural(2, "child", "children") == "2 children"
    import numpy as np
    import torch
    assert plural(np.int64(1), "rank") == "1 rank"
    assert plural(torch.tensor(1).item(), "rank") == "1 rank"
    assert plural(1.5, "step") == "1.5 steps"
    assert plural(np.int64(3), "rank") == "3 ranks"


def test_plural_names_agrees_with_its_list():
    """Messages name which ranks: 'rank 1', 'ranks 1 and 3', never 'rank(s) [1]'."""
    from helpers.words import plural_names
    assert plural_names([1], "rank") == "rank 1"
    assert plural_names((1, 3), "rank") == "ranks 1 and 3"
    assert plural_names(range(3), "rank") == "ranks 0, 1 and 2"
    assert plural_names([], "process") == "no processes"
    assert plural_names(["cuda:0", "cpu"], "device") == "devices cuda:0 and cpu"
