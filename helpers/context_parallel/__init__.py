"""Part VII: context parallelism (the sequence split over ranks): ring attention by hand
(scratch), all-to-all attention over the heads (ulysses), PyTorch's context_parallel
(torch_api), the chapter's experiments (experiments; what they return: results)."""
