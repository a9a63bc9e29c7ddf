"""GPU profiles: one GPU model's clock tables, power limits, roofline, switching latency and cost-model
parameters, loaded from and written to ``configs/gpus/*.yaml``."""
