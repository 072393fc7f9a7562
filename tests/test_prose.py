

def test_plural_agrees_with_its_count():
    """Printed counts read '1 rank', '2 ranks', never '1 ranks' or 'rank(s)'."""
    from helpers.prose import plural
    assert plural(1, "rank") == "1 rank"
    assert plural(2, "rank") == "2 ranks"
    assert plural(0, "sample") == "0 samples"
    assert plural(1, "process") == "1 process"
    assert plural(4, "process") == "4 processes"
    assert plural(2, "batch") == "2 batches"
    assert plural(2048, "byte") == "2,048 bytes"
    assert plural(2, "child", "children") == "2 children"
    import numpy as np
    import torch
    assert plural(np.int64(1), "rank") == "1 rank"
    assert plural(torch.tensor(1).item(), "rank") == "1 rank"
    assert plural(1.5, "step") == "1.5 steps"
