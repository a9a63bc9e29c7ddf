"""What the controller measures and how it keeps to the budget: the A/B windows and their order, the paired
estimator, the per-window accounting of time and energy, the performance guard, the budget feedback of the
online policy, and the job summary over a torchrun job's ranks."""
