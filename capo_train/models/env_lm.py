"""A tiny causal LM for any text env, built from that env's own text: ``model.path: tiny``.

SmolLM2-135M reads a WebShop page or an ALFWorld room at tens of tokens a second on two CPU cores, so an
RL iteration of 16 multi-turn episodes takes many minutes (docs/results/performance.md). A model of ~2M
parameters with a tokenizer fitted to the env's text runs the same iteration in seconds, which is what lets a
CPU show an agent improving on the domains (docs/results/domains/). It knows nothing before the warm start:
``sft.state_loss_coef`` teaches it to read the env's text while it clones a demonstrator.

The tokenizer (``tiny_lm.train_tokenizer``: byte-level BPE, ChatML specials, a space before a capital or a
digit split off so a name or a product ID has the same ids wherever it stands) is fitted to what the agent
will read and write: the env's protocol instructions, and the observations and actions of episodes played on
the train split by the env's expert and by a demonstrator that errs half the time (so it also sees the pages
a wrong click leads to). The instructions and the action tags are one token each. Dev and test tasks are
never played. The model is ``tiny_lm.MODEL_PRESETS[preset]`` (``small``: 4 layers, hidden 128).

``model.path: tiny[:<preset>[:<episodes>]]`` (``parse_tiny_path``): the preset (default ``small``) and how
many train episodes the tokenizer reads (default 200; SynthShop's recipe reads 600, enough to see every
product of its catalogue). ``ensure_env_lm`` builds it once per (env id, kwargs, preset, episodes) into
``<data dir>/models/tiny-<env>-<hash>`` (atomic: a folder appears only complete) and reuses it afterwards.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import shutil
from pathlib import Path
from typing import Any, Callable

TINY_PATH = "tiny"  # the model.path that asks for this model
TEXT_EPISODES = 200  # train episodes played to fit the tokenizer
BUILD_VERSION = 1  # bump when what is built changes, so cached folders are rebuilt
ACTION_TAG = re.compile(r"</?\w+>")  # <search>, </action>: the tags an action format wraps its calls in
# An identifier: 8+ capitals and digits, with at least one of each (WebShop's product IDs, B0GZH89GLC).
IDENTIFIER = re.compile(r"\b(?=[A-Z0-9]*\d)(?=[A-Z0-9]*[A-Z])[A-Z0-9]{8,}\b")


def env_texts(env, episodes: int = TEXT_EPISODES, seed: int = 0) -> tuple[list[str], list[str]]:
    """``(texts, fixed)``: the text of ``episodes`` train episodes of ``env`` (instructions, observations,
    actions), and the strings to make single tokens: the protocol's (instructions, stop strings, action tags)
    and every identifier seen (``IDENTIFIER``), so copying a product ID from a page into a click is a
    one-token copy, as copying a word is, instead of seven BPE pieces a tiny model must learn to chain.

    Even episodes follow the expert; odd ones take a random legal action half the time (``random_action``),
    where the env has one. Needs ``expert_action()``."""
    base = env.unwrapped
    rng = random.Random(seed)
    texts, fixed = ["system\nuser\nassistant"], set()
    for n in range(episodes):
        obs, info = env.reset(seed=seed + n)
        protocol = info.get("protocol") or {}
        if protocol.get("instructions"):
            fixed.add(protocol["instructions"])
        fixed.update(s for s in protocol.get("stop_strings") or () if len(s) > 1)
        texts.append(obs)
        fixed.update(IDENTIFIER.findall(obs))
        done = False
        while not done:
            action = None
            if n % 2 and rng.random() < 0.5 and callable(getattr(base, "random_action", None)):
                action = base.random_action(rng)
            action = action or base.expert_action()
            if action is None:
                raise ValueError(f"{env.spec.id if env.spec else base}: model.path=tiny needs an env with an expert "
                                 "(expert_action) to learn its text from")
            fixed.update(ACTION_TAG.findall(action))
            texts.append(action)
            obs, _, terminated, truncated, _ = env.step(action)
            texts.append(obs)
            fixed.update(IDENTIFIER.findall(obs))
            done = terminated or truncated
    return texts, sorted(fixed, key=lambda s: (-len(s), s))


def parse_tiny_path(path: str) -> tuple[str, int] | None:
    """``(preset, episodes)`` of a ``tiny[:preset[:episodes]]`` model path; None for any other path."""
    name, *rest = path.split(":")
    if name != TINY_PATH or len(rest) > 2:
        return None
    preset = rest[0] if rest and rest[0] else "small"
    episodes = rest[1] if len(rest) > 1 else str(TEXT_EPISODES)
    if not episodes.isdigit() or int(episodes) < 1:
        raise ValueError(f"model.path {path!r}: the episode count must be a positive integer")
    return preset, int(episodes)


def env_lm_folder(env_id: str, kwargs: dict[str, Any], preset: str, episodes: int = TEXT_EPISODES,
                  data_dir: Path | None = None) -> Path:
    """Where ``ensure_env_lm`` keeps the model of this env id, kwargs, preset and episode count."""
    from capo_envs.core.paths import data_dir as default_data_dir

    key = json.dumps({"env": env_id, "kwargs": kwargs, "preset": preset, "episodes": episodes,
                      "version": BUILD_VERSION}, sort_keys=True, default=str)
    slug = re.sub(r"[^a-z0-9]+", "-", env_id.lower()).strip("-")
    root = Path(data_dir) if data_dir is not None else default_data_dir()
    return root / "models" / f"tiny-{slug}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def build_env_lm(out: Path, make_env: Callable[[], Any], *, preset: str = "small", seed: int = 0,
                 episodes: int = TEXT_EPISODES) -> Path:
    """Fit the tokenizer to the env's text (``env_texts``), build the model, write both to ``out``."""
    from .tiny_lm import MODEL_PRESETS, TINY_LM_META, make_model, train_tokenizer

    if preset not in MODEL_PRESETS:
        raise ValueError(f"unknown tiny model preset {preset!r}; choose one of {sorted(MODEL_PRESETS)}")
    env = make_env()
    try:
        texts, fixed = env_texts(env, episodes, seed)
    finally:
        env.close()
    shape = dict(MODEL_PRESETS[preset])
    tokenizer = train_tokenizer(texts, shape.pop("vocab_size"), fixed)
    model = make_model(tokenizer, seed=seed, **shape)
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    meta = {"env_text_episodes": episodes, "fixed_tokens": len(fixed), "vocab_size": len(tokenizer), **shape,
            "seed": seed, "parameters": sum(p.numel() for p in model.parameters())}
    (tmp / TINY_LM_META).write_text(json.dumps(meta, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def ensure_env_lm(env_id: str, kwargs: dict[str, Any], make_env: Callable[[], Any], *, preset: str = "small",
                  episodes: int = TEXT_EPISODES, data_dir: Path | None = None) -> Path:
    """The tiny LM folder for this env, built on first use (``build_env_lm``) and reused afterwards."""
    out = env_lm_folder(env_id, kwargs, preset, episodes, data_dir)
    if not (out / "config.json").is_file():
        build_env_lm(out, make_env, preset=preset, episodes=episodes)
    return out
