"""capo_train: the CAPO reference trainer and its baselines, on any env that follows the capo_envs contract."""
