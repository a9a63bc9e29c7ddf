"""Learned clock policies, in rooms: ``training`` (PPO with stable-baselines3, the imitation warm start, the
anchor, the budget multipliers, training end to end) and ``policy`` (frozen numpy policies, the planner
interface, the shipped policies and a frozen policy deciding online); and their evaluation over disturbed
episodes (``noisy_evaluation``) and on steps of other shapes (``shape_evaluation``)."""
