"""kdvfs world model: kernel traces, GPU profiles, the cost model and the Gymnasium environment."""
