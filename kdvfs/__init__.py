"""kdvfs: learned kernel-level GPU clock (DVFS) policies for PyTorch training.

The import namespace of the repository's three packages, in the direction of their dependencies:
``kdvfs.envs`` (the world model) <- ``kdvfs.agents`` (decision makers) <- ``kdvfs.runtime`` (the real GPU).
In the repository they are the top-level folders ``envs/``, ``agents/`` and ``runtime/``; ``kdvfs/`` links them.
"""

__version__ = "0.1.0"
