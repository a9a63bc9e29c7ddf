"""kdvfs: learned kernel-level GPU clock (DVFS) policies for PyTorch training.

The import namespace of the repository's packages, in the direction of their dependencies:
``kdvfs.common`` (project-wide basics: errors, config loading, files, paths, run records, the array type)
<- ``kdvfs.envs`` (the world model) <- ``kdvfs.agents`` (decision makers) <- ``kdvfs.runtime`` (the real GPU).
In the repository they are the top-level folders ``common/``, ``envs/``, ``agents/`` and ``runtime/``;
``kdvfs/`` links them.
"""

__version__ = "0.1.0"
