"""Real execution of plans with torch.distributed (gloo on CPU, NCCL on GPUs).

Filled in by the executor issue; the simulator never imports this package eagerly.
"""
