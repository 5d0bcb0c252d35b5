"""The error every configuration problem raises, in a module of its own so that any module can raise it
without importing the config (``capo_train.config`` re-exports it)."""


class ConfigError(ValueError):
    """A config value, or a combination of values, that cannot run; the message names the key."""
