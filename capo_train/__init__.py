"""capo_train: the CAPO reference trainer and its baselines, on any env that follows the capo_envs contract.

Where to start reading: ``trainer.py``, the RL loop (``train``, then ``rl_iteration`` per iteration). The
modules it calls, one job each:

- ``config.py`` (and ``config_rules.py``, ``errors.py``): the run's settings, read from YAML and
  ``key=value`` overrides, every value checked before anything loads;
- ``setup.py``: building the envs, the model, its optimizers and the KL reference;
  ``distributed.py``: what differs with several processes;
- ``rollout.py``: playing episodes with a generation backend (``backends/``), the states built by
  ``states.py``, env calls scheduled by ``envpool.py``; ``rows.py``: episodes laid out as model-input rows;
- ``update.py``: the targets (critic values, reference log-probs, the estimator) and the critic and actor
  updates; the estimators and losses themselves are ``algorithms/`` (pure torch);
- ``evaluation.py``: held-out evaluation; ``report.py``: ``log.jsonl`` (keys: docs/metrics.md), the summary
  and the learning curve; ``episodes.py``: the episodes recorded for ``capo view`` (``viewer/``);
- ``sft.py``: the warm start (behaviour cloning of the env's expert);
- ``models/``: loading models, LoRA, the critics, log-probs, checkpoints, the default SmolLM2 and tiny models;
- ``compare.py`` (and ``compare_report.py``): ``capo compare``, a grid of algorithms x envs x seeds;
- ``cli.py``: the ``capo`` command; ``integrations/verl/``: the same algorithms inside verl.
"""
