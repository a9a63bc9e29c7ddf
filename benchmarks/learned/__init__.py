"""Benchmarks of the learned policies, CPU only: policies against the planners on held-out steps, PPO against its
clone, the environment's speed."""
