"""The Gymnasium environments ``KernelDVFS-v0`` and ``KernelDVFSResidual-v0`` (residual actions, measured observation):
the policy's clock grid, one step's data prepared for stepping,
the observation and its spec, the plan advisors and where requests land, the split of training and held-out
workloads, and what a controller's live decision reads of it (``live``, ``live_tables``)."""

from gymnasium.envs.registration import register

register(id="KernelDVFS-v0", entry_point="kdvfs.envs.env.dvfs_env:KernelDVFSEnv")
register(id="KernelDVFSResidual-v0", entry_point="kdvfs.envs.env.residual_env:ResidualDVFSEnv")
