"""``plain/Count-v0``: say the number you are shown. A plain ``gymnasium.Env`` with no capo import, no
``task_ids()``, no ``split`` and no expert: what the trainer must cope with from any env author.

Importing this module registers the ids, so ``gym.make("plain_env_pkg.envs:plain/Count-v0")`` works.
"""

from __future__ import annotations

import string

import gymnasium as gym

PROTOCOL = {"instructions": "Reply with the number you are asked for, then </n>.", "stop_strings": ["</n>"]}


class CountEnv(gym.Env):
    """Each episode asks for a number in 1..9 (drawn from the reset seed); the answer ends the episode
    with reward 1 if it contains the number, else the question is asked again, up to ``max_steps``."""

    metadata = {"render_modes": []}

    def __init__(self, max_steps: int = 2, publish_protocol: bool = True, report_metrics: bool = True):
        self.observation_space = gym.spaces.Text(max_length=200, charset=string.printable)
        self.action_space = gym.spaces.Text(max_length=10_000, charset=string.printable)
        self.max_steps, self.publish_protocol, self.report_metrics = max_steps, publish_protocol, report_metrics
        self.target = self.steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.target, self.steps = int(self.np_random.integers(1, 10)), 0
        info = {"protocol": dict(PROTOCOL)} if self.publish_protocol else {}
        return f"Say {self.target}.", info

    def step(self, action):
        self.steps += 1
        correct = str(self.target) in str(action)
        terminated, truncated = correct, not correct and self.steps >= self.max_steps
        info = {}
        if (terminated or truncated) and self.report_metrics:
            info["metrics"] = {"success": float(correct), "steps": self.steps}
        return ("Done." if correct else f"No. Say {self.target}."), float(correct), terminated, truncated, info


gym.register("plain/Count-v0", entry_point=CountEnv)
# The same env without info["protocol"] and without metrics: the trainer's defaults must carry it.
gym.register("plain/CountBare-v0", entry_point=CountEnv, kwargs={"publish_protocol": False, "report_metrics": False})
