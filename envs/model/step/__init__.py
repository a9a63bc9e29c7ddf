"""The step model's parts: aligning the kernels of steps of different shapes, fitting each kernel's numbers in
the shape variables, and the leave-one-shape-out error. The public entry is :mod:`kdvfs.envs.model.step_model`."""
