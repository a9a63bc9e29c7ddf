"""kdvfs world model: kernel traces, GPU profiles, the cost model and the Gymnasium environment."""

from gymnasium.envs.registration import register

register(id="KernelDVFS-v0", entry_point="kdvfs.envs.env.dvfs_env:KernelDVFSEnv")
