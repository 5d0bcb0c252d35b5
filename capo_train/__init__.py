"""capo_train: the CAPO reference trainer and its baselines (see issue 3); today: the `capo` command."""
