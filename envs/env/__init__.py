"""The Gymnasium environment ``KernelDVFS-v0``: the policy's clock grid, one step's data prepared for stepping,
the observation and its spec, the plan advisors, and the split of training and held-out workloads."""

from gymnasium.envs.registration import register

register(id="KernelDVFS-v0", entry_point="kdvfs.envs.env.dvfs_env:KernelDVFSEnv")
