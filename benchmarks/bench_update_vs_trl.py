"""Update throughput (action tokens/s) of capo, ppo and grpo against TRL's GRPOTrainer, side by side in one run.

    pip install trl==1.16.0   # for this benchmark only: TRL is not a dependency of capo-gym or its tests
    python benchmarks/bench_update_vs_trl.py [--model tiny|smollm2|PATH] [--sequences 16] \
        [--prompt-tokens 128] [--completion-tokens 64] [--steps 4] [--threads 1] [--lora] \
        [--trl-defaults | --trl-set bf16=true]

Measured with trl 1.16.0 (transformers 5.24.0, torch 2.13.0 CPU). Both sides get the same initial
weights (``--model tiny``: ``make_tiny_llama(hidden_size=256, num_layers=4)`` saved once and loaded by
both), the same token ids (``--sequences`` single-turn sequences of ``--prompt-tokens`` random prompt
tokens + ``--completion-tokens`` random completion tokens, no padding), the same rewards and groups
(``--group`` sequences per task), and one optimizer step on the whole batch (one mini-batch, one epoch,
AdamW lr 1e-4, weight decay 0.01, grad clip 1.0, entropy computed, no KL term, float32, no gradient
checkpointing; ``--lora`` gives both sides the same peft LoRA instead of full fine-tuning).

What is timed:

- ours: ``capo_train.update.update(...)`` on a ``RowBatch`` from ``build_rows`` (critic and actor
  passes, backward, clip, AdamW step, diagnostics). ``compute_targets`` (the no-grad critic scoring pass
  that capo and ppo make before the update) is timed separately and shown in its own column.
- TRL: its real training loop, ``GRPOTrainer.train()``, with generation stubbed: ``_prepare_inputs``
  returns a fixed, precomputed batch (prompt/completion ids and masks, group-normalised advantages,
  ``num_items_in_batch``), exactly the dict its ``_generate_and_score_completions`` would hand over. A
  ``TrainerCallback`` times ``on_step_begin`` -> ``on_step_end``, i.e. ``training_step`` (forward with its
  fused LM-head log-probs, loss, backward) + grad clipping + optimizer and scheduler step + zero_grad.
  With ``beta=0`` and one step per generation TRL makes no reference or old-log-prob pass, so nothing of
  its no-grad work is left out.

The steps are interleaved: after each TRL step (in ``on_step_end``, outside TRL's timed region) every
one of our algorithms makes one step, so a noisy neighbour slows every system alike. The first
``--warmup`` rounds are dropped. Ratios are medians of per-round paired ratios. On a machine whose cores
are shared with other jobs, ``--threads 1`` gives steadier (and there, faster) figures than torch's
default of one thread per core, whose workers spin-wait on each other.

By default TRL runs with the settings matched to ours (``bf16=False, gradient_checkpointing=False``);
``--trl-defaults`` keeps TRL's own defaults instead (bf16 autocast, gradient checkpointing on,
``adamw_torch_fused`` either way), i.e. what a user gets out of the box; ``--trl-set KEY=VALUE`` changes
one GRPOConfig field at a time (e.g. ``--trl-set bf16=true``) to see what each setting costs.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings

import torch

from capo_train.algorithms import get
from capo_train.config import load_config
from capo_train.models import evaluating, make_tiny_llama
from capo_train.rows import ActionRecord, Trajectory, build_rows, gather_actions
from capo_train.models import resolve_model_path
from capo_train.setup import build_model
from capo_train.setup import make_optimizers as _optimizers
from capo_train.update import compute_targets, update

LORA = {"r": 16, "alpha": 32, "last_layers": 8}  # the trainer's defaults (capo_train.config.ModelConfig)


def make_batch(tokenizer, args):
    """Prompt and completion ids ``[N, P]``, ``[N, C]`` of ordinary tokens, rewards ``[N]``, groups ``[N]``."""
    g = torch.Generator().manual_seed(args.seed)
    special = set(tokenizer.all_special_ids)
    ordinary = torch.tensor([i for i in range(len(tokenizer)) if i not in special])
    pick = lambda shape: ordinary[torch.randint(len(ordinary), shape, generator=g)]  # noqa: E731
    prompts, completions = pick((args.sequences, args.prompt_tokens)), pick((args.sequences, args.completion_tokens))
    rewards = torch.randint(0, 2, (args.sequences,), generator=g).float()
    groups = torch.arange(args.sequences) // args.group
    return prompts, completions, rewards, groups


class Ours:
    """One of our algorithms: its own ActorCritic, optimizers and the batch laid out as rows."""

    def __init__(self, algo: str, model_dir: str, args, prompts, completions, rewards, groups):
        overrides = [
            f"algo={algo}", f"model.path={model_dir}", f"model.lora={str(args.lora).lower()}",
            f"model.lora_r={LORA['r']}", f"model.lora_alpha={LORA['alpha']}",
            f"model.lora_last_layers={LORA['last_layers']}", f"optim.minibatch_rows={args.sequences}",
            "optim.ppo_epochs=1", f"rollout.group_size={args.group}", "log_tensorboard=false",
        ]
        self.name, self.config = algo, load_config(None, overrides)
        self.algo = get(algo).bind(self.config.algo_overrides)
        self.model, tokenizer = build_model(self.config, self.algo)
        self.optimizers = _optimizers(self.model, self.config)
        trajectories = [
            Trajectory(
                traj_id=i, task_id=f"task{int(groups[i])}", group_id=int(groups[i]),
                actions=[ActionRecord(prompt_ids=p.tolist(), action_ids=c.tolist(), old_logprobs=[0.0] * len(c),
                                      reward=float(r), action_valid=True, obs_ids=[])],
                terminated=True, truncated=False, metrics={}, anchors=["obs"],
            )
            for i, (p, c, r) in enumerate(zip(prompts, completions, rewards))
        ]
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.batch = build_rows(trajectories, "packed", pad)
        with evaluating(self.model):  # on-policy old log-probs, as the rollout would have recorded them
            out = self.model(self.batch.input_ids, self.batch.attention_mask, need_values=False,
                             logp_mask=self.batch.action_index >= 0)
        self.batch.old_logp = gather_actions(out.logp, self.batch)
        self.tokens = float(self.batch.action_mask.sum())
        self.rounds = 0

    def step(self) -> tuple[float, float]:
        """Seconds of ``compute_targets`` and of ``update``."""
        start = time.perf_counter()
        final_value = torch.zeros(self.batch.num_actions) if self.algo.needs_critic else None
        targets = compute_targets(self.model, self.algo, self.batch, final_value)
        middle = time.perf_counter()
        generator = torch.Generator().manual_seed(self.rounds)
        update(self.model, self.optimizers, self.algo, self.batch, targets, self.config, generator)
        self.rounds += 1
        return middle - start, time.perf_counter() - middle


def make_trl(model_dir: str, tokenizer, args, prompts, completions, rewards, groups, on_step):
    """A GRPOTrainer whose ``_prepare_inputs`` returns the fixed batch; ``on_step(seconds)`` after each step."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    N, C = completions.shape
    mean = torch.stack([rewards[groups == g].mean() for g in groups])
    std = torch.stack([rewards[groups == g].std() for g in groups])
    advantages = (rewards - mean) / (std + 1e-4)  # TRL's scale_rewards="group"
    fixed = {
        "prompt_ids": prompts, "prompt_mask": torch.ones_like(prompts),
        "completion_ids": completions, "completion_mask": torch.ones_like(completions),
        "advantages": advantages, "num_items_in_batch": torch.tensor(float(N * C)),
    }
    import yaml

    matched = {} if args.trl_defaults else {"bf16": False, "gradient_checkpointing": False}
    for pair in args.trl_set:  # e.g. bf16=true: one TRL setting at a time, to see what each costs
        key, _, value = pair.partition("=")
        matched[key] = yaml.safe_load(value)
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-bench-"), per_device_train_batch_size=N, num_generations=args.group,
        max_completion_length=C, max_steps=args.warmup + args.steps, learning_rate=1e-4, weight_decay=0.01,
        max_grad_norm=1.0, beta=0.0, use_cpu=True, logging_steps=10_000, save_strategy="no", report_to=[],
        dataloader_num_workers=0, seed=args.seed, **matched,
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, local_files_only=True)
    peft_config = None
    if args.lora:  # the same adapters as capo_train.models.actor_critic._lora builds for our side
        from peft import LoraConfig

        from capo_train.models.actor_critic import LoraSettings, _last_layers

        settings = LoraSettings(**LORA)
        peft_config = LoraConfig(r=settings.r, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                                 target_modules=list(settings.target_modules), task_type="CAUSAL_LM",
                                 layers_to_transform=_last_layers(model, settings.last_layers))
    dataset = Dataset.from_dict({"prompt": ["unused: generation is stubbed"] * (N * (args.warmup + args.steps))})
    trainer = GRPOTrainer(
        model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions), args=config,
        train_dataset=dataset, processing_class=tokenizer, peft_config=peft_config,
    )
    calls = []
    trainer._prepare_inputs = lambda generation_batch: calls.append(1) or dict(fixed)

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            on_step(time.perf_counter() - self.start)

    trainer.add_callback(Timer())
    return trainer, calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="tiny (make_tiny_llama), smollm2, or a local HF folder")
    parser.add_argument("--hidden", type=int, default=256, help="tiny model hidden size")
    parser.add_argument("--layers", type=int, default=4, help="tiny model layers")
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--group", type=int, default=4, help="sequences per task (GRPO groups)")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--completion-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=4, help="timed rounds")
    parser.add_argument("--warmup", type=int, default=1, help="rounds dropped before timing")
    parser.add_argument("--algos", default="capo,ppo,grpo")
    parser.add_argument("--lora", action="store_true", help=f"LoRA on both sides ({LORA}) instead of full fine-tuning")
    parser.add_argument("--trl-defaults", action="store_true", help="TRL with its own defaults (bf16, checkpointing)")
    parser.add_argument("--trl-set", action="append", default=[], metavar="KEY=VALUE",
                        help="override one GRPOConfig field on TRL's side (repeatable), e.g. bf16=true")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.sequences % args.group:
        parser.error("--sequences must be a multiple of --group")
    warnings.filterwarnings("ignore")

    import transformers
    import trl

    from capo_train.models import load_tokenizer

    tmp = tempfile.TemporaryDirectory(prefix="bench-update-")
    if args.model == "tiny":
        model, tokenizer = make_tiny_llama(hidden_size=args.hidden, num_layers=args.layers, seed=args.seed)
        model.save_pretrained(tmp.name)
        tokenizer.save_pretrained(tmp.name)
        model_dir, what = tmp.name, f"tiny llama (hidden {args.hidden}, {args.layers} layers)"
        del model
    else:
        model_dir, what = resolve_model_path(args.model), args.model
    tokenizer = load_tokenizer(model_dir)
    prompts, completions, rewards, groups = make_batch(tokenizer, args)
    ours = [Ours(a, model_dir, args, prompts, completions, rewards, groups) for a in args.algos.split(",")]
    params = sum(p.numel() for p in ours[0].model.actor.parameters())
    trainable = sum(p.numel() for p in ours[0].model.actor_parameters())
    print(f"model: {what}, {params / 1e6:.1f}M parameters ({trainable / 1e6:.2f}M trained"
          f"{', LoRA' if args.lora else ', full fine-tuning'}), vocab {len(tokenizer)}")
    print(f"batch: {args.sequences} sequences x ({args.prompt_tokens} prompt + {args.completion_tokens} completion) "
          f"tokens, groups of {args.group}; {args.warmup} warm-up + {args.steps} timed rounds")

    times: dict[str, list[float]] = {"trl": [], **{o.name: [] for o in ours}}
    target_times: dict[str, list[float]] = {o.name: [] for o in ours}

    def after_trl_step(seconds: float) -> None:
        times["trl"].append(seconds)
        k = len(times["trl"]) % len(ours)
        for o in ours[k:] + ours[:k]:  # rotate the order, so no algorithm always runs right after TRL
            t_targets, t_update = o.step()
            target_times[o.name].append(t_targets)
            times[o.name].append(t_update)

    trainer, calls = make_trl(model_dir, tokenizer, args, prompts, completions, rewards, groups, after_trl_step)
    trl_trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    print(f"trained parameters: ours {trainable / 1e6:.2f}M, TRL {trl_trainable / 1e6:.2f}M")
    settings = "its defaults" if args.trl_defaults else "matched (fp32, no checkpointing)"
    settings += "".join(f" + {pair}" for pair in args.trl_set)
    print(f"torch {torch.__version__} ({torch.get_num_threads()} threads), transformers {transformers.__version__}, "
          f"trl {trl.__version__}; TRL settings: {settings} (bf16 {trainer.args.bf16}, gradient checkpointing "
          f"{trainer.args.gradient_checkpointing}, optimizer {trainer.args.optim.value}); ours: torch.optim.AdamW")
    watched = next(p for p in trainer.model.parameters() if p.requires_grad)
    before = watched.detach().clone()
    trainer.train()
    assert len(calls) == args.warmup + args.steps, f"TRL prepared {len(calls)} batches, expected one per step"
    assert not torch.equal(before, watched.detach()), "TRL's steps did not change the weights"
    keep = slice(args.warmup, None)
    tokens = ours[0].tokens
    assert tokens == args.sequences * args.completion_tokens

    trl_s = times["trl"][keep]
    ppo_s = times["ppo"][keep] if "ppo" in times else None
    paired = lambda a, b: statistics.median(x / y for x, y in zip(a, b))  # noqa: E731
    trl_label = "trl GRPOTrainer" + (" (defaults)" if args.trl_defaults else "")
    trl_label += "".join(f" {pair}" for pair in args.trl_set)
    w = max(28, len(trl_label) + 2)
    print(f"\n{'system':<{w}}{'update s':>10}{'tokens/s':>10}{'vs trl':>9}{'vs ppo':>9}"
          f"{'+targets s':>12}{'tokens/s incl.':>16}{'vs trl':>9}")
    print(f"{trl_label:<{w}}{statistics.median(trl_s):>10.3f}{tokens / statistics.median(trl_s):>10.0f}"
          f"{'1.00x':>9}{'-':>9}{'-':>12}{tokens / statistics.median(trl_s):>16.0f}{'1.00x':>9}")
    for o in ours:
        up = times[o.name][keep]
        both = [u + t for u, t in zip(up, target_times[o.name][keep])]
        vs_trl = paired(trl_s, up)  # tokens/s ratio = inverse time ratio
        vs_ppo = f"{paired(up, ppo_s):.2f}x" if ppo_s else "-"  # cost relative to ppo: time ratio
        print(f"{'ours ' + o.name:<{w}}{statistics.median(up):>10.3f}{tokens / statistics.median(up):>10.0f}"
              f"{vs_trl:>8.2f}x{vs_ppo:>9}{statistics.median(both):>12.3f}{tokens / statistics.median(both):>16.0f}"
              f"{paired(trl_s, both):>8.2f}x")
    print(f"tokens = {tokens:.0f} action (completion) tokens per step. 'vs trl': throughput relative to TRL "
          f"(>1 = faster); 'vs ppo': update time relative to ours ppo (>1 = costlier); '+targets': adds the "
          f"no-grad compute_targets pass (critic values for capo/ppo; TRL makes none with beta=0).")
    tmp.cleanup()


if __name__ == "__main__":
    main()
