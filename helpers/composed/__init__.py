"""Part VII: everything at once. The small GPT on a 3-D mesh from the course's own pieces
(model, scratch; experiments runs it, and the same run from PyTorch's engines), and the planner that
picks a layout (planner)."""
# results.py: what the launch targets return, frozen dataclasses read by field.
