"""Benchmarks of the world model and the planners, CPU only: the cost model against measurements and published
figures, feature estimation, synthetic traces, the step model, planners and ranges."""
