"""Training a clock policy: the PPO config and run, the clone of the expert, the anchor, the budget
multipliers and the fixed-margin plans a residual policy must beat."""
