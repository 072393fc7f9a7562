"""Part VII: expert parallelism. A mixture-of-experts layer in one process (moe), its experts
spread over ranks with all-to-all dispatch and combine by hand (scratch), the chapter's runs
(experiments)."""
from .moe import MoE, expert_capacity, load_balancing_loss, moe_inputs, route
from .scratch import AllToAll, ExpertParallelMoE, all_to_all
from .experiments import ep_chapter, ep_equal_run, ep_imbalance_run, moe_step

__all__ = ["MoE", "expert_capacity", "load_balancing_loss", "moe_inputs", "route", "AllToAll",
           "ExpertParallelMoE", "all_to_all", "ep_chapter", "ep_equal_run", "ep_imbalance_run",
           "moe_step"]
