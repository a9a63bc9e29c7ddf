"""Exact and classic planners: the multiple-choice-knapsack ILP (global and per kernel), the
latency-aware optimum, auto, best static pair, per phase, greedy per kernel, the reactive governor, the
registry of every method by name, the power-limit baseline (the lowest board power limit within a budget), and
the prediction margin (the share of the budget that plans of predicted steps are made at)."""
