"""Part VII: everything at once. The small GPT on a 3-D mesh from the course's own pieces
(scratch) and from PyTorch's (torch_api), and the planner that picks a layout (planner)."""
from .gpt import (GPTEmbed, GPTHead, coords_of, gpt, gpt_batches, gpt_layers, gpt_loss,
                  rank_grid, stage_cuts)
from .scratch import build_stage, new_groups, one_process_run, train_3d_scratch

__all__ = ["GPTEmbed", "GPTHead", "coords_of", "gpt", "gpt_batches", "gpt_layers", "gpt_loss",
           "rank_grid", "stage_cuts", "build_stage", "new_groups", "one_process_run",
           "train_3d_scratch"]
