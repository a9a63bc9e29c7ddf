"""Synthetic training steps: transformer workload configs (``configs/workloads/``), the kernels one step
launches with their FLOPs and bytes, and traces priced on a GPU profile's roofline."""
