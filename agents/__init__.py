"""kdvfs decision makers: learned PPO policies, exact planners and baselines, behind one interface."""
