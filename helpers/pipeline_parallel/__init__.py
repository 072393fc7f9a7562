"""Pipeline parallelism: consecutive layers on consecutive devices, micro-batches in flight.

schedules (the GPipe and 1F1B orders, clock, bubble, plots), simulated (Part I, one process),
scratch (Part VI, across processes over a comm), torch_api (torch.distributed.pipelining),
experiments (Part VI's runs; what they return: results), verdicts (the words of Part VI's
chapter).
"""
