"""The README's first snippet, for every env id that needs no downloaded data, on a bare `pip install .`.

Run by .ci/run in a fresh venv with no extras: a module the offline envs import but pyproject.toml does not
declare fails here (as scipy once did), and so does an env that pulls torch in."""

import sys

import gymnasium as gym

import capo_envs

offline = [card.id for card in capo_envs.CATALOG.values() if card.prepare is None]
assert offline, "no offline env is registered"
for env_id in offline:
    env = gym.make(env_id)
    obs, info = env.reset(seed=0)
    assert isinstance(obs, str) and obs, env_id
    protocol = env.unwrapped.protocol
    expert = env.unwrapped.expert_action()
    action = expert if expert is not None else "Let me look.<search>anything</search>"
    obs, reward, terminated, truncated, info = env.step(action)
    assert isinstance(info["action_valid"], bool) and not (terminated and truncated), env_id
    env.close()
    print(f"{env_id}: reset and step ok (action_valid={info['action_valid']})")
heavy = sorted(m for m in ("torch", "transformers", "capo_train") if m in sys.modules)
assert not heavy, f"capo_envs imported {heavy}"
print(f"bare install: {len(offline)} offline envs ok, no torch imported")
