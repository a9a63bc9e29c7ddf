"""Exact and classic planners: the multiple-choice-knapsack ILP (global and per kernel), the
latency-aware optimum, auto, best static pair, per phase, greedy per kernel, the reactive governor, the
registry of every method by name, and the power-limit baseline (the lowest board power limit within a budget)."""
