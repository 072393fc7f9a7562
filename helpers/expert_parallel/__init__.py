"""Part VII: expert parallelism. A mixture-of-experts layer in one process (moe), its experts
spread over ranks with all-to-all dispatch and combine by hand (scratch), as production code
does it with torch's functional all-to-all, DTensor and grouped GEMM (torch_api), the chapter's
runs (experiments; what they return: results)."""
from .experiments import ep_equal_run, ep_imbalance_run, ep_production_run, moe_step
from .moe import MoE, expert_capacity, load_balancing_loss, moe_inputs, route, router_z_loss
from .scratch import AllToAll, ExpertParallelMoE, all_to_all
from .torch_api import (
                        EPMoE,
                        GroupedExperts,
                        ep_dp_mesh,
                        grouped_mm,
                        grouped_mm_status,
                        permute_by_expert,
)

__all__ = ["MoE", "expert_capacity", "load_balancing_loss", "moe_inputs", "route",
           "router_z_loss", "AllToAll", "ExpertParallelMoE", "all_to_all", "EPMoE",
           "GroupedExperts", "ep_dp_mesh", "grouped_mm", "grouped_mm_status",
           "permute_by_expert", "ep_equal_run", "ep_imbalance_run",
           "ep_production_run", "moe_step"]
