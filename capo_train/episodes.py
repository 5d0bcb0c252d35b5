"""Recorded episodes: a bounded sample of each recorded iteration's episodes, with how every action was credited.

Every ``record_every`` iterations (and on the first and last one) the trainer writes
``<out_dir>/episodes/iter-<NNNNNN>.jsonl``, one line per episode (at most ``record_episodes``, whole groups
first), and once ``episodes/meta.json`` (the algorithm, its clip range and ratio kind). With recording on,
each held-out evaluation's greedy episodes go to ``episodes/eval-<NNNNNN>.jsonl`` (iteration 0: before RL),
with the same fields but no credit (they are not trained on). ``capo view`` reads them.

Per action (``actions[t]``):

- ``observation``: the env text the policy answered (the anchor of step t); ``action``: the generated text
  (special tokens kept), ``tokens``: its token count; ``valid`` and ``reason`` (the env protocol's parse error
  for an invalid action, re-parsed here: rollouts keep only the flag); ``reward``.
- ``value``: the critic's V(s_t) at the action boundary (critic algorithms; null otherwise); ``return``: the
  estimator's return (the critic target, or the Monte-Carlo quantity a critic-free advantage is built from);
  ``advantage_raw`` = return - value before whitening (critic algorithms); ``advantage``: what the policy
  loss used (whitened where the algorithm whitens). Token-level quantities (PPO, REINFORCE++) are summarised
  per action by their mean over the action's tokens.
- ``ratio``, ``clip_frac``, ``clipped``: from the actor update's last pass over the action (its last epoch).
  Action-ratio losses (capo, gspo, ...): the action's one ratio w_t, and whether the clipped branch of
  ``min(w A, clip(w) A)`` was taken (clip_frac 0 or 1; token advantages: the share of tokens). Token-ratio
  losses (ppo, grpo, ...): the mean token ratio, ``ratio_min``/``ratio_max``, the share of tokens on the
  clipped branch and ``dual_clip_frac``; ``clipped`` when more than half the tokens were.

Texts are cut to ``MAX_TEXT_CHARS`` (head and tail kept) and episodes to ``MAX_ACTIONS`` actions, so a
recorded iteration stays small whatever the env. Files are written atomically (temporary file, rename).
Recording never stops training: a failure is a warning.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path

import torch

from .algorithms.losses import MAX_LOG_RATIO, action_log_ratio, clipped_surrogate, token_log_ratio
from .rollout import episode_success, success_key

EPISODES_DIR = "episodes"
META = "meta.json"
MAX_TEXT_CHARS = 2000  # per recorded text; longer ones keep their head and tail
MAX_ACTIONS = 64  # per recorded episode


def records_iteration(iteration: int, every: int, iterations: int) -> bool:
    """Whether RL iteration ``iteration`` (1-based) is recorded: the first, every ``every``-th and the last
    (``every`` 0: none)."""
    return every > 0 and (iteration == 1 or iteration % every == 0 or iteration == iterations)


def episode_file(out_dir: str | Path, iteration: int, kind: str = "iter") -> Path:
    """``episodes/iter-<NNNNNN>.jsonl`` (training) or, with ``kind="eval"``, the held-out evaluation's file."""
    return Path(out_dir) / EPISODES_DIR / f"{kind}-{iteration:06d}.jsonl"


def clip_text(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    if len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    return f"{text[:head]}\n[... {len(text) - limit} characters cut ...]\n{text[-tail:]}"


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _per_action(x: torch.Tensor | None, mask: torch.Tensor) -> list[float] | None:
    """``[A]`` as is, ``[A, L]`` as the mean over each action's tokens."""
    if x is None:
        return None
    x = x.detach().float().cpu()
    if x.dim() == 1:
        return x.tolist()
    m = mask.bool().cpu()[:, : x.shape[1]]
    return (torch.where(m, x, 0).sum(1) / m.sum(1).clamp(min=1)).tolist()


class EpisodeRecorder:
    """Collects per-action update diagnostics during one iteration (:meth:`observe`, called by the trainer's
    actor update for each mini-batch) and writes the iteration's sample (:meth:`write`)."""

    def __init__(self, algo, max_episodes: int):
        self.algo = algo
        self.max_episodes = max_episodes
        self.token_ratio = algo.ratio_mode == "token"
        self.update: dict[int, dict[str, float]] = {}  # action id -> ratio, clip fraction, ...
        self.failed = False

    # ------------------------------------------------------------------ during the update

    @torch.no_grad()
    def observe(self, action_id: torch.Tensor, logp: torch.Tensor, old_logp: torch.Tensor,
                advantages: torch.Tensor, mask: torch.Tensor) -> None:
        """One mini-batch of the actor update: the per-action ratio and clip decision, computed as the policy
        loss computes them (same inputs, same functions); a later pass over an action overwrites an earlier."""
        if self.failed:
            return
        try:
            self._observe(action_id, logp.detach(), old_logp, advantages, mask)
        except Exception as e:  # noqa: BLE001  (diagnostics must never stop training)
            self.failed = True
            warnings.warn(f"episode recording: the update diagnostics failed ({type(e).__name__}: {e})",
                          RuntimeWarning, stacklevel=2)

    def _observe(self, action_id, logp, old_logp, advantages, mask) -> None:
        kw = self.algo.loss_kwargs
        m = mask.bool()
        adv = advantages[:, None].expand_as(logp) if advantages.dim() == 1 else advantages
        clip_low, clip_high = kw.get("clip_low", 0.2), kw.get("clip_high", 0.2)
        lengths = m.sum(1).clamp(min=1)
        if self.token_ratio:
            ratio = torch.exp(token_log_ratio(logp, old_logp, m))
        else:
            log_w = action_log_ratio(logp, old_logp, m, kw.get("ratio_mode", "capo"), mu=kw.get("mu"),
                                     max_log_ratio=kw.get("max_log_ratio", MAX_LOG_RATIO))
            ratio = torch.exp(log_w)[:, None].expand_as(logp)
        dual = kw.get("dual_clip") if self.token_ratio else None
        _, clipped, dual_active = clipped_surrogate(adv, ratio, clip_low, clip_high, dual)
        clip_frac = (clipped & m).sum(1) / lengths
        mean_ratio = torch.where(m, ratio, 0).sum(1) / lengths
        extra: dict[str, torch.Tensor] = {}
        if self.token_ratio:
            extra["ratio_min"] = torch.where(m, ratio, math.inf).min(1).values
            extra["ratio_max"] = torch.where(m, ratio, -math.inf).max(1).values
            if dual is not None:
                extra["dual_clip_frac"] = (dual_active & m).sum(1) / lengths
        for i, a in enumerate(action_id.tolist()):
            entry = {"ratio": float(mean_ratio[i]), "clip_frac": float(clip_frac[i])}
            entry |= {k: float(v[i]) for k, v in extra.items()}
            self.update[a] = entry

    # ------------------------------------------------------------------ after the update

    def write(self, out_dir: str | Path, iteration: int, trajectories, batch, targets, tokenizer,
              env=None) -> Path | None:
        """Write ``episodes/iter-<iteration>.jsonl`` (and ``meta.json`` once); a failure is a warning."""
        try:
            return self._write(Path(out_dir), iteration, trajectories, batch, targets, tokenizer, env)
        except Exception as e:  # noqa: BLE001
            warnings.warn(f"episode recording failed at iteration {iteration}: {type(e).__name__}: {e}",
                          RuntimeWarning, stacklevel=2)
            return None

    def _write(self, out_dir, iteration, trajectories, batch, targets, tokenizer, env) -> Path:
        mask = batch.action_mask.cpu()
        numbers: dict[str, list | None] = {"advantage": _per_action(targets.advantages, mask),
                                           "return": _per_action(targets.returns, mask), "value": None,
                                           "advantage_raw": None}
        if targets.old_values is not None:
            old = targets.old_values.detach().float().cpu()
            numbers["value"] = (old if old.dim() == 1 else old[:, 0]).tolist()  # V(s_t): before the first token
            if targets.returns is not None:
                numbers["advantage_raw"] = _per_action(targets.returns.detach().float().cpu() - old, mask)
        traj_index = batch.traj_index.cpu().tolist()
        step_index = batch.step_index.cpu().tolist()
        action_of = {(tr, st): a for a, (tr, st) in enumerate(zip(traj_index, step_index))}

        def credit(i: int, t: int) -> dict:
            a = action_of.get((i, t))
            if a is None:
                return {}
            entry = {k: (_finite(v[a]) if v is not None else None) for k, v in numbers.items()}
            entry |= {k: _finite(v) for k, v in self.update.get(a, {}).items()}
            if entry.get("clip_frac") is not None:
                entry["clipped"] = entry["clip_frac"] > 0.5
            return entry

        path = episode_file(out_dir, iteration)
        write_episodes(path, trajectories[: self.max_episodes], iteration, tokenizer, env, "train", credit)
        meta = path.parent / META
        if not meta.exists():
            write_atomic(meta, json.dumps(self.meta(), indent=2))
        return path

    def meta(self) -> dict:
        kw = self.algo.loss_kwargs
        return {
            "algo": self.algo.name,
            "ratio": "token" if self.token_ratio else kw.get("ratio_mode", "capo"),
            "clip_low": kw.get("clip_low"),
            "clip_high": kw.get("clip_high"),
            "dual_clip": kw.get("dual_clip"),
            "critic": self.algo.critic_at,
            "max_text_chars": MAX_TEXT_CHARS,
            "max_actions": MAX_ACTIONS,
        }


def write_episodes(path: Path, trajectories, iteration: int, tokenizer, env, split: str, credit=None) -> Path:
    """One JSON line per trajectory (see the module doc), written atomically; ``credit(i, t)`` gives the
    per-action numbers of trajectory i's action t (none for held-out episodes: they are not trained on)."""
    protocol = getattr(getattr(env, "unwrapped", None), "protocol", None)
    key = success_key(trajectories)
    lines = []
    for i, traj in enumerate(trajectories):
        actions = []
        for t, rec in enumerate(traj.actions[:MAX_ACTIONS]):
            text = tokenizer.decode(rec.action_ids, skip_special_tokens=False)
            actions.append({
                "step": t,
                "observation": clip_text(traj.anchors[t]) if t < len(traj.anchors) else "",
                "action": clip_text(text),
                "tokens": len(rec.action_ids),
                "valid": rec.action_valid,
                "reason": "" if rec.action_valid else (rec.invalid_reason or _reason(protocol, text)),
                "reward": rec.reward,
                **(credit(i, t) if credit is not None else {}),
            })
        lines.append(json.dumps({
            "iteration": iteration,
            "split": split,
            "episode": i,
            "task_id": traj.task_id,
            "group_id": traj.group_id,
            "success": episode_success(traj, key),
            "return": sum(r.reward for r in traj.actions),
            "terminated": traj.terminated,
            "truncated": traj.truncated,
            "invalid_actions": sum(not r.action_valid for r in traj.actions),
            "num_actions": len(traj.actions),
            "metrics": traj.metrics,
            "prompt": clip_text(tokenizer.decode(traj.actions[0].prompt_ids, skip_special_tokens=False))
            if traj.actions else "",
            "actions": actions,
        }, ensure_ascii=False))
    write_atomic(path, "".join(line + "\n" for line in lines))
    return path


def held_out_recorder(config, iteration: int, tokenizer, env):
    """For ``evaluation.evaluate(on_trajectories=...)``: writes the held-out (greedy) episodes of the evaluation
    after RL iteration ``iteration`` (0: before RL) to ``episodes/eval-<iteration>.jsonl``; None when
    recording is off. A failure is a warning."""
    if not config.record_every:
        return None

    def record(trajectories) -> None:
        try:
            path = episode_file(config.out_dir, iteration, kind="eval")
            write_episodes(path, list(trajectories)[: config.record_episodes], iteration, tokenizer, env, "held-out")
        except Exception as e:  # noqa: BLE001
            warnings.warn(f"held-out episode recording failed: {type(e).__name__}: {e}", RuntimeWarning, stacklevel=2)

    return record


def _reason(protocol, text: str) -> str:
    """Why the env rejected ``text``, for an env whose step gave no ``info["invalid_reason"]``: its protocol's
    parse error, else a generic word. Only the syntax: a protocol that also checks the page (WebShop's) would
    judge the env's state now, after the episode, not the one the action met (it said "the purchase is done"
    of a click refused on a product page), so the reason the step gave comes first."""
    parse = getattr(protocol, "parse", None)
    if callable(parse):
        try:
            error = getattr(parse(text), "error", None)
            if error:
                return str(error)
        except Exception:  # noqa: BLE001
            pass
    return "rejected by the env"


def recorder_for(config, iteration: int, algo) -> EpisodeRecorder | None:
    """The recorder for RL iteration ``iteration`` (0-based, as the trainer counts), or None when it is not
    recorded (``record_every``, ``record_episodes``)."""
    if not records_iteration(iteration + 1, config.record_every, config.iterations):
        return None
    return EpisodeRecorder(algo, config.record_episodes)
