"""Part VII: everything at once. The small GPT on a 3-D mesh from the course's own pieces
(scratch; experiments runs it, and the same run from PyTorch's engines), and the planner that picks
a layout (planner)."""
# results.py: what the launch targets return, frozen dataclasses read by field.
from .experiments import train_3d_scratch, train_3d_torch
from .model import GPTEmbed, GPTHead, gpt, gpt_batches, gpt_layers, gpt_loss, stage_cuts
from .planner import candidate_layouts, format_plan, layout_costs, plan, stage_costs
from .scratch import build_stage, one_process_run

__all__ = ["GPTEmbed", "GPTHead", "gpt", "gpt_batches", "gpt_layers", "gpt_loss",
           "stage_cuts", "build_stage", "one_process_run",
           "train_3d_scratch", "train_3d_torch", "candidate_layouts",
           "format_plan", "layout_costs", "plan", "stage_costs"]
