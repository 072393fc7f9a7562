"""Part VII: everything at once. The small GPT on a 3-D mesh from the course's own pieces
(scratch) and from PyTorch's (torch_api), and the planner that picks a layout (planner)."""
# results.py: what the launch targets return, frozen dataclasses read by field.
from .model import GPTEmbed, GPTHead, gpt, gpt_batches, gpt_layers, gpt_loss, stage_cuts
from .planner import candidate_layouts, format_plan, layout_costs, plan, stage_costs
from .scratch import build_stage, one_process_run, train_3d_scratch
from .torch_api import train_3d_torch

__all__ = ["GPTEmbed", "GPTHead", "gpt", "gpt_batches", "gpt_layers", "gpt_loss",
           "stage_cuts", "build_stage", "one_process_run",
           "train_3d_scratch", "train_3d_torch", "candidate_layouts",
           "format_plan", "layout_costs", "plan", "stage_costs"]
