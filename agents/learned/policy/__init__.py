"""A trained policy in use: the frozen file and its compiled forward pass, the planner interface, the
shipped policies, and the policy deciding online inside a running step."""
