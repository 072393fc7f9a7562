"""Part VII: expert parallelism. A mixture-of-experts layer in one process (moe), its experts
spread over ranks with all-to-all dispatch and combine by hand (scratch), as production code
does it with torch's functional all-to-all, DTensor and grouped GEMM (torch_api), the chapter's
runs (experiments; what they return: results)."""
