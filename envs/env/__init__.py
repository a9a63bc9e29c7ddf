"""The Gymnasium environments ``KernelDVFS-v0`` (:mod:`~kdvfs.envs.env.dvfs_env`) and ``KernelDVFSResidual-v0``
(:mod:`~kdvfs.envs.env.residual_env`), their settings (``config``), execution, disturbances, reward and timing
regimes; in rooms: ``steps`` (the clock grid, steps priced for stepping, shape pairs, the workload split),
``advice`` (the plan advisors and where requests land) and ``observing`` (the observation, the one function that
writes it at a state, and what a controller measures)."""

from gymnasium.envs.registration import register

register(id="KernelDVFS-v0", entry_point="kdvfs.envs.env.dvfs_env:KernelDVFSEnv")
register(id="KernelDVFSResidual-v0", entry_point="kdvfs.envs.env.residual_env:ResidualDVFSEnv")
