"""Learned clock policies: PPO with stable-baselines3, the imitation warm start, training end to end,
frozen numpy policies and a frozen policy behind the planner interface, and a frozen policy deciding online
(``online``; its compiled decision: ``live_decision``)."""
