"""What an episode runs on: the policy's clock grid, a step priced for stepping, the pairs of a predicted
and an executed step, and the training / held-out workload split."""
