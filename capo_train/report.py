"""What a run writes about itself: ``log.jsonl`` (one record per iteration; TensorBoard and wandb when asked
for), ``summary.json`` and ``learning_curve.png``, and the reader of ``log.jsonl`` that ``capo compare`` and
``capo view`` share. Every key a record may hold is listed in docs/metrics.md."""

from __future__ import annotations

import json
import math
import os
import sys
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

from .config import TrainConfig, to_dict


class Logger:
    """JSONL always; TensorBoard and wandb when installed and asked for.

    ``log.jsonl`` starts as ``history``, the records of the checkpoint the run continues from (none for a
    new run): the trainer writes a record after the checkpoint that holds it (the record's
    ``time/checkpoint_s`` is known only then), so a kill between the two leaves the log a record short, and
    a log left by an older run that logged first may hold an iteration its checkpoint lacks; either way the
    resumed run's log is the checkpoint's records, each iteration once."""

    def __init__(self, out_dir: Path, config: TrainConfig, history: list[dict] = ()):
        self.path = out_dir / "log.jsonl"
        tmp = out_dir / ".log.jsonl.tmp"
        tmp.write_text("".join(json.dumps(record) + "\n" for record in history))
        os.replace(tmp, self.path)  # atomic: a kill now leaves the old log or the trimmed one
        self.tb = self.wandb = None
        if config.log_tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(out_dir / "tensorboard"))
            except ImportError:
                pass
        if config.log_wandb:
            try:
                import wandb  # optional, the extra [wandb]: pip install "capo-gym[wandb]"

                self.wandb = wandb.init(project="capo-gym", config=to_dict(config))
            except ImportError:
                warnings.warn("log_wandb is set but wandb is not installed", RuntimeWarning, stacklevel=2)

    def log(self, record: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        step = record.get("iteration", 0)
        if self.tb is not None:
            for key, value in record.items():
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self.tb.add_scalar(key, value, step)
        if self.wandb is not None:
            self.wandb.log(record, step=step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


# ----------------------------------------------------------------------------- where an iteration's time goes

# The phases of an RL iteration, in the order they run: the ones a record holds add up to its
# time/iteration_s (tests/test_trainer_timing.py checks it). docs/metrics.md says what each covers; capo
# view's run page stacks them per iteration.
ITERATION_PHASES = (
    "time/log_s", "time/rollout_s", "time/rows_s", "time/old_logp_s", "time/values_s", "time/reference_s",
    "time/estimate_s", "time/update_s", "time/weight_sync_s", "time/record_s", "time/eval_s", "time/checkpoint_s",
)
# Parts of a phase (not added again): generation and env calls inside the rollout, the critic's and the
# actor's mini-batch passes inside the update.
PHASE_PARTS = {
    "time/rollout_s": ("time/rollout_generate_s", "time/rollout_env_s"),
    "time/update_s": ("time/update_critic_s", "time/update_actor_s"),
}


def _synchronize() -> None:
    """Wait for queued GPU work (a phase's kernels run after its Python returns), when torch is loaded."""
    torch = sys.modules.get("torch")  # no import: capo view reads this module without torch
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class Stopwatch:
    """Wall seconds per phase (``seconds``, keyed ``time/<phase>_s``); a phase timed twice adds up. The GPU
    is synchronised at each boundary, so asynchronous kernels count in the phase that launched them."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextmanager
    def phase(self, key: str):
        _synchronize()
        start = time.perf_counter()
        try:
            yield
        finally:
            _synchronize()
            self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - start


def read_log(path: Path, skip_bad_lines: bool = False, notes: list[str] | None = None) -> list[dict]:
    """The run's records, one per iteration: a run killed between logging and checkpointing repeats an
    iteration when resumed, so the last record of each iteration wins. ``skip_bad_lines``: ignore lines that
    are not UTF-8 JSON objects with an integer ``iteration`` (``capo view`` reads folders it did not write)
    instead of raising, and say which in ``notes`` (one line each, the first ``MAX_NOTES``)."""
    if not skip_bad_lines:
        if not path.exists():
            return []
        return _read_records(path.read_text(encoding="utf-8").splitlines(), path)
    notes = [] if notes is None else notes
    try:
        lines = path.read_bytes().split(b"\n") if path.exists() else []
    except OSError as e:
        notes.append(f"{path.name}: cannot read it ({e.strerror or e})")
        return []
    by_iteration: dict[int, dict] = {}
    skipped = 0
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        why = None
        try:
            record = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            why = "not UTF-8"
        except (ValueError, RecursionError):  # JSONDecodeError, an int over Python's digit limit, deep nesting
            why = "not valid JSON (a line being written, or cut)"
        else:
            iteration = record.get("iteration", 0) if isinstance(record, dict) else None
            if not isinstance(record, dict):
                why = "not a JSON object"
            elif not _is_integral(iteration):
                why = f"its iteration is not an integer: {str(iteration)[:40]!r}"
            else:
                record["iteration"] = int(iteration)
                by_iteration[record["iteration"]] = record
        if why is not None:
            skipped += 1
            if skipped <= MAX_NOTES:
                notes.append(f"{path.name} line {number} skipped: {why}")
    if skipped > MAX_NOTES:
        notes.append(f"{path.name}: {skipped - MAX_NOTES} more lines skipped")
    return [by_iteration[i] for i in sorted(by_iteration)]


MAX_NOTES = 20  # notes about one file's skipped lines (then a count)


def _is_integral(x) -> bool:
    return (isinstance(x, int) and not isinstance(x, bool)) or (
        isinstance(x, float) and math.isfinite(x) and x == int(x))


def _read_records(lines: list[str], path: Path) -> list[dict]:
    by_iteration: dict[int, dict] = {}
    for line in lines:
        if not line.strip():
            continue
        record = json.loads(line)
        if not isinstance(record, dict):
            raise ValueError(f"{path}: a line that is not a JSON object: {line[:80]!r}")
        by_iteration[int(record.get("iteration", 0))] = record
    return [by_iteration[i] for i in sorted(by_iteration)]


def summarise_run(history: list[dict], config: TrainConfig) -> dict:
    """``summary.json``: the held-out success after the warm start and at the end, and the iteration time."""
    evals = [(h["iteration"], h["eval/success"]) for h in history if "eval/success" in h]
    iteration_s = [h["time/iteration_s"] for h in history if "time/iteration_s" in h]
    return {
        "algo": config.algo,
        "env": config.env.id,
        "iterations": len(iteration_s),
        "eval_success_after_warm_start": next((s for i, s in evals if i == 0), None),
        "eval_success_final": evals[-1][1] if evals else None,
        "seconds_per_iteration": sum(iteration_s) / len(iteration_s) if iteration_s else None,
    }


def progress_postfix(record: dict) -> dict[str, str]:
    """The few numbers the iteration bar shows."""
    return {
        "success": f"{record.get('rollout/success', 0):.2f}",
        "reward": f"{record.get('rollout/reward_mean', 0):.2f}",
        "invalid": f"{record.get('rollout/invalid_action_rate', 0):.2f}",
        "tok/s": f"{record.get('throughput/rollout_tokens_per_s', 0):.0f}",
    }


def plot_curves(history: list[dict], path: Path, title: str) -> None:
    """``learning_curve.png``: training rollout success and held-out success against the iteration."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    train = [(h["iteration"], h["rollout/success"]) for h in history if "rollout/success" in h]
    evals = [(h["iteration"], h["eval/success"]) for h in history if "eval/success" in h]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    if train:
        ax.plot(*zip(*train), label="train rollouts (T=1)")
    if evals:
        ax.plot(*zip(*evals), marker="o", label="held-out (greedy)")
    ax.set_xlabel("iteration")
    ax.set_ylabel("success")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
