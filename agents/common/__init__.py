"""What every decision maker shares: the planning problem of one step on one GPU, the planner interface
and the scoring of a schedule on the cost model."""
