"""One command that says whether a GPU runs capo-gym's training step well: on a randomly initialised model of
Qwen3-1.7B's shape (built from a config: nothing is downloaded),

1. generation tokens/s with the trainer's own backend (``HFBackend``), and with vLLM when it is installed
   and a GPU is present;
2. one CAPO update, the way ``capo train`` makes it (``update.compute_targets`` then ``update.update``):
   a separate critic, a frozen reference for the KL term, AdamW on actor and critic; its wall time, model
   FLOPs utilisation (MFU) and peak memory;
3. the log-prob gap between generation and training: the log-probs the backend recorded while sampling
   (the rollout's old log-probs) against the training forward pass on the same tokens. On a GPU in
   bfloat16 the two differ (different kernels, KV cache versus full sequence); the gap is what the first
   PPO ratio sees before any update (docs/vllm.md has why it matters for CAPO's 3e-4 action clip).

    python benchmarks/gpu_check.py            # Qwen3-1.7B's shape; a few minutes on one GPU
    python benchmarks/gpu_check.py --tiny     # the same steps on a 2-layer model: seconds on a CPU (CI)

It prints one line per step and ends with a JSON summary (``--json PATH`` writes it too).

Model FLOPs count matrix multiplies only, 2 per multiply-add: per token, a forward pass is ``2 N`` (N: the
parameters used as matrices, the LM head included, the input embedding excluded) plus attention's
``4 L d S`` (L layers, d = heads x head_dim, S the row's length, counted at full length as PaLM's appendix B
does); a backward pass is twice its forward. The update does: critic forward (values) and reference forward
(KL log-probs) without gradient, then the critic's and the actor's forward and backward. MFU divides by the
device's dense bf16 peak (a table by device name, or ``--peak-tflops``); on a CPU none is known, so only the
achieved TFLOP/s is reported. Peak memory: ``torch.cuda.max_memory_allocated`` on a GPU; on a CPU, the
process's peak resident set (``ru_maxrss``), which includes everything Python loaded.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import random
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Qwen3-1.7B's config.json (Qwen/Qwen3-1.7B on the Hugging Face hub): 28 layers, hidden 2048, 16 query and
# 8 key/value heads of 128, MLP 6144, a 151,936-token vocabulary, tied embeddings; 1.72B parameters.
QWEN3_1_7B = dict(vocab_size=151_936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                  max_position_embeddings=40_960, rope_theta=1_000_000.0, rms_norm_eps=1e-6)
TINY = dict(QWEN3_1_7B, vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096)
# Dense bf16 tensor-core peaks (vendor data sheets, SXM parts), matched against torch's device name.
PEAK_BF16_TFLOPS = {"H200": 989.4, "H100": 989.4, "H800": 989.4, "A100": 312.0, "A800": 312.0, "L40S": 362.1,
                    "L4": 121.0, "A10": 125.0, "RTX 4090": 165.2, "B200": 2250.0, "GH200": 989.4}


@dataclass
class Shape:
    batch: int  # trajectories
    prompt_tokens: int  # first state
    actions: int  # actions per trajectory
    action_tokens: int  # max new tokens per action
    obs_tokens: int  # tokens of each observation between actions
    minibatch_rows: int  # rows per optimizer step of the update


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model and a small batch (CPU, CI)")
    parser.add_argument("--device", default="auto", help="auto (cuda when available), cuda or cpu")
    parser.add_argument("--dtype", default="auto", help="auto (bfloat16 on a GPU, float32 on a CPU), bfloat16, float32")
    parser.add_argument("--batch", type=int, help="trajectories (default 32; --tiny 4)")
    parser.add_argument("--prompt-tokens", type=int, help="first-state tokens (default 512; --tiny 32)")
    parser.add_argument("--actions", type=int, help="actions per trajectory (default 2)")
    parser.add_argument("--action-tokens", type=int, help="max new tokens per action (default 128; --tiny 8)")
    parser.add_argument("--obs-tokens", type=int, help="observation tokens after an action (default 128; --tiny 8)")
    parser.add_argument("--minibatch-rows", type=int, help="rows per optimizer step (default 8; --tiny 2)")
    parser.add_argument("--vllm", choices=("auto", "off"), default="auto",
                        help="also time vLLM when installed (GPU only)")
    parser.add_argument("--peak-tflops", type=float, help="the device's dense peak, for MFU (default: by device name)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the summary to this file")
    return parser.parse_args(argv)


def say(text: str) -> None:
    print(f"[gpu_check] {text}", flush=True)


def synthetic_tokenizer(vocab_size: int):
    """A word-level tokenizer with exactly ``vocab_size`` tokens (``t0 ... tN``; the last two are EOS and
    pad), so every id the random model samples decodes; no file is read."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(vocab_size - 2)}
    vocab |= {"<eos>": vocab_size - 2, "<pad>": vocab_size - 1}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>")


def build_models(shape: dict, device, dtype, seed: int):
    """Actor, separate critic (own backbone, value head) and frozen reference, randomly initialised."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3Model

    from capo_train.models.actor_critic import ActorCritic, SeparateCritic

    config = Qwen3Config(**shape, bos_token_id=None, eos_token_id=shape["vocab_size"] - 2,
                         pad_token_id=shape["vocab_size"] - 1)
    torch.manual_seed(seed)
    with torch.device(device):
        actor = Qwen3ForCausalLM(config).to(dtype)
        critic = SeparateCritic(Qwen3Model(config).to(dtype)).to(dtype)
    reference = copy.deepcopy(actor).eval().requires_grad_(False)
    model = ActorCritic(actor, critic, meta={"base": "random Qwen3-1.7B shape", "critic": "separate"})
    return model, reference, config


def matrix_params(module, exclude_embedding: bool = True) -> int:
    """Parameters used in matrix multiplies: every weight but the input embedding (a tied LM head is counted
    once, as the head)."""
    import torch

    embeddings = {id(m.weight) for m in module.modules() if isinstance(m, torch.nn.Embedding)}
    total, seen = 0, set()
    for p in module.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        if exclude_embedding and id(p) in embeddings and not _is_tied_head(module, p):
            continue
        total += p.numel()
    return total


def _is_tied_head(module, p) -> bool:
    head = getattr(module, "lm_head", None)
    return head is not None and head.weight is p


def forward_flops(n_matrix: int, config, row_lengths: list[int]) -> float:
    """Model FLOPs of one forward pass over rows of these lengths (see the module doc)."""
    d_attn = config.num_attention_heads * config.head_dim
    return sum(2 * n_matrix * s + 4 * config.num_hidden_layers * d_attn * s * s for s in row_lengths)


def peak_tflops(device, given: float | None) -> float | None:
    import torch

    if given is not None:
        return given
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16_TFLOPS.items() if key in name), None)


class Clock:
    def __init__(self, device):
        self.device = device

    def now(self) -> float:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()


def peak_memory_gib(device) -> float:
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def reset_peak(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def rollout(backend, tokenizer, shape: Shape, vocab: int, seed: int, clock: Clock):
    """``shape.actions`` generate calls over ``shape.batch`` growing states (random prompt and observation
    tokens, sampled actions), recorded as trajectories; returns them and the generation time and tokens."""
    from capo_train.rows import ActionRecord, Trajectory

    rng = random.Random(seed)
    words = vocab - 2  # never the EOS or pad ids in env text
    states = [[rng.randrange(words) for _ in range(shape.prompt_tokens)] for _ in range(shape.batch)]
    trajectories = [Trajectory(traj_id=i, task_id=str(i), group_id=i, actions=[], terminated=False, truncated=False,
                               metrics={}, anchors=[]) for i in range(shape.batch)]
    seconds, tokens = 0.0, 0
    for step in range(shape.actions):
        start = clock.now()
        generations = backend.generate(states, stop=[], max_new_tokens=shape.action_tokens, temperature=1.0,
                                       seed=seed + step)
        seconds += clock.now() - start
        for traj, state, gen in zip(trajectories, states, generations):
            tokens += len(gen.token_ids)
            last = step == shape.actions - 1
            obs = [] if last else [rng.randrange(words) for _ in range(shape.obs_tokens)]
            traj.actions.append(ActionRecord(prompt_ids=list(state), action_ids=gen.token_ids,
                                             old_logprobs=gen.logprobs,
                                             reward=float(rng.random() < 0.5) if last else 0.0,
                                             action_valid=True, obs_ids=obs))
            traj.anchors.append("")
            state.extend(gen.token_ids + obs)
        for traj in trajectories:
            traj.terminated = True
    return trajectories, seconds, tokens


def logprob_gap(model, batch) -> dict[str, float]:
    """The training pass's log-probs of the sampled tokens against the ones recorded while sampling."""
    import torch

    from capo_train.models.logprobs import evaluating
    from capo_train.rows import gather_actions

    with torch.no_grad(), evaluating(model):
        out = model(batch.input_ids, batch.attention_mask, need_values=False, logp_mask=batch.action_index >= 0)
    logp = gather_actions(out.logp, batch).float()
    mask = batch.action_mask.bool()
    gap = (logp - batch.old_logp.float())[mask]
    return {"logp_gap_mean_abs": gap.abs().mean().item(), "logp_gap_max_abs": gap.abs().max().item(),
            "logp_gap_mean": gap.mean().item(), "ratio_mean": gap.exp().mean().item(), "tokens": int(mask.sum())}


def capo_update(model, reference, batch, minibatch_rows: int, seed: int):
    """One CAPO iteration's scoring and update, as ``capo train`` makes it; returns the update's stats."""
    import torch

    from capo_train.algorithms import get
    from capo_train.config import TrainConfig
    from capo_train.setup import make_optimizers as _optimizers
    from capo_train.update import compute_targets, update

    config = TrainConfig()
    config.model.critic, config.model.lora = "separate", False
    config.optim.minibatch_rows = minibatch_rows
    config.optim.actor_lr = 1e-6
    config.log_entropy = False
    algo = get("capo").bind({"kl_coef": 0.001})  # the paper's KL: the reference pass is part of the step
    optimizers = _optimizers(model, config)
    targets = compute_targets(model, algo, batch, None, reference, 1.0)
    generator = torch.Generator().manual_seed(seed)
    return update(model, optimizers, algo, batch, targets, config, generator)


def vllm_generation(model, tokenizer, shape: Shape, vocab: int, seed: int, workdir: Path, dtype_name: str) -> dict:
    """Tokens/s of vLLM on the same random weights (saved to ``workdir``), token-id prompts, sampled-token
    log-probs after temperature (``logprobs_mode="processed_logprobs"``); also its trajectories, for the
    log-prob gap. Written without a GPU to run it on: a failure is reported, not raised."""
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from capo_train.rows import ActionRecord, Trajectory

    model.actor.save_pretrained(workdir)
    tokenizer.save_pretrained(workdir)
    # the trainer's dtype, so that the log-prob gap measures the engines, not a dtype change
    torch.cuda.empty_cache()  # vLLM checks at start-up that its share is free; torch's cache counts as taken
    llm = LLM(model=str(workdir), dtype=dtype_name, seed=seed, gpu_memory_utilization=0.3, enforce_eager=False,
              logprobs_mode="processed_logprobs")
    rng = random.Random(seed)
    prompts = [TokensPrompt(prompt_token_ids=[rng.randrange(vocab - 2) for _ in range(shape.prompt_tokens)])
               for _ in range(shape.batch)]
    params = SamplingParams(temperature=1.0, max_tokens=shape.action_tokens, logprobs=0, seed=seed, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(max_tokens=4))  # warm-up: compile and capture graphs
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    seconds = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    del llm
    trajectories = []
    for i, (prompt, out) in enumerate(zip(prompts, outputs)):
        sample = out.outputs[0]
        logprobs = [step[token].logprob for step, token in zip(sample.logprobs, sample.token_ids)]
        trajectories.append(Trajectory(traj_id=i, task_id=str(i), group_id=i, terminated=True, truncated=False,
                                       metrics={}, anchors=[""], actions=[ActionRecord(
                                           prompt_ids=list(prompt["prompt_token_ids"]),
                                           action_ids=list(sample.token_ids),
                                           old_logprobs=logprobs, reward=0.0, action_valid=True, obs_ids=[])]))
    return {"vllm_tokens_per_s": tokens / seconds, "vllm_tokens": tokens, "vllm_seconds": seconds}, trajectories


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from capo_train.backends import HFBackend
    from capo_train.rows import build_rows

    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    dtype_name = args.dtype if args.dtype != "auto" else ("bfloat16" if device.type == "cuda" else "float32")
    dtype = getattr(torch, dtype_name)
    small = args.tiny
    shape = Shape(batch=args.batch or (4 if small else 32), prompt_tokens=args.prompt_tokens or (32 if small else 512),
                  actions=args.actions or 2, action_tokens=args.action_tokens or (8 if small else 128),
                  obs_tokens=args.obs_tokens or (8 if small else 128),
                  minibatch_rows=args.minibatch_rows or (2 if small else 8))
    model_shape = TINY if small else QWEN3_1_7B
    clock = Clock(device)
    summary: dict = {"model": "tiny Qwen3 (2 layers)" if small else "Qwen3-1.7B shape, random weights",
                     "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                     "dtype": dtype_name, "shape": shape.__dict__, "torch": torch.__version__,
                     "threads": torch.get_num_threads()}

    start = clock.now()
    tokenizer = synthetic_tokenizer(model_shape["vocab_size"])
    model, reference, config = build_models(model_shape, device, dtype, args.seed)
    n_actor = sum(p.numel() for p in model.actor.parameters())
    summary |= {"actor_parameters": n_actor, "build_s": clock.now() - start}
    say(f"{summary['model']}: {n_actor / 1e6:.1f}M parameters, {dtype_name} on {summary['device']} "
        f"({summary['build_s']:.1f} s to build actor, critic and reference)")

    backend = HFBackend(model.actor, tokenizer, batch_size=shape.batch, reuse_prefixes=True)
    backend.generate([[1, 2, 3]], stop=[], max_new_tokens=2, seed=0)  # warm-up (CUDA context, kernels)
    trajectories, gen_s, gen_tokens = rollout(backend, tokenizer, shape, model_shape["vocab_size"], args.seed, clock)
    summary |= {"hf_tokens_per_s": gen_tokens / gen_s, "hf_generated_tokens": gen_tokens, "hf_generate_s": gen_s}
    say(f"HF generation: {gen_tokens} tokens in {gen_s:.2f} s = {gen_tokens / gen_s:.1f} tokens/s "
        f"({shape.batch} sequences x {shape.actions} actions)")

    batch = build_rows(trajectories, "packed", backend.pad_id)
    batch.action_id = torch.arange(batch.num_actions)
    batch = batch.to(device)
    gap = logprob_gap(model, batch)
    summary |= gap
    say(f"log-prob gap, generation vs training ({gap['tokens']} tokens): mean |gap| {gap['logp_gap_mean_abs']:.2e}, "
        f"max {gap['logp_gap_max_abs']:.2e}, mean ratio {gap['ratio_mean']:.4f}")

    rows = batch.attention_mask.sum(1).tolist()
    n_actor_matrix = matrix_params(model.actor)
    n_critic_matrix = matrix_params(model.critic)
    flops = (forward_flops(n_critic_matrix, config, rows) + forward_flops(n_actor_matrix, config, rows)  # no-grad
             + 3 * forward_flops(n_critic_matrix, config, rows) + 3 * forward_flops(n_actor_matrix, config, rows))
    reset_peak(device)
    start = clock.now()
    stats = capo_update(model, reference, batch, shape.minibatch_rows, args.seed)
    update_s = clock.now() - start
    peak = peak_tflops(device, args.peak_tflops)
    achieved = flops / update_s / 1e12
    summary |= {"update_s": update_s, "update_rows": batch.num_rows, "update_tokens": int(sum(rows)),
                "update_model_tflops": flops / 1e12, "update_achieved_tflops_per_s": achieved,
                "peak_tflops": peak, "mfu": achieved / peak if peak else None,
                "peak_memory_gib": peak_memory_gib(device),
                "peak_memory_kind": "torch.cuda.max_memory_allocated" if device.type == "cuda" else "process ru_maxrss",
                "actor_loss": stats.get("actor/loss"), "critic_loss": stats.get("critic/loss"),
                "kl_ref": stats.get("actor/kl_ref")}
    mfu = f"MFU {summary['mfu']:.1%}" if peak else "MFU n/a (no known peak for this device; --peak-tflops)"
    say(f"CAPO update (critic, reference, actor; {batch.num_rows} rows, {int(sum(rows))} tokens): {update_s:.2f} s, "
        f"{achieved:.3f} TFLOP/s, {mfu}, peak memory {summary['peak_memory_gib']:.2f} GiB "
        f"({summary['peak_memory_kind']}); losses finite: "
        f"{all(math.isfinite(v) for v in (summary['actor_loss'], summary['critic_loss']) if v is not None)}")

    if args.vllm == "auto" and device.type == "cuda":
        try:
            import vllm  # noqa: F401
        except ImportError:
            summary["vllm"] = "not installed"
        else:
            import tempfile

            try:
                torch.cuda.empty_cache()  # the update's activations and optimizer states are gone
                with tempfile.TemporaryDirectory(prefix="gpu-check-") as workdir:
                    figures, vllm_trajectories = vllm_generation(model, tokenizer, shape, model_shape["vocab_size"],
                                                                 args.seed, Path(workdir), dtype_name)
                summary |= figures
                say(f"vLLM generation: {summary['vllm_tokens_per_s']:.1f} tokens/s")
                vllm_batch = build_rows(vllm_trajectories, "packed", backend.pad_id)
                vllm_batch.action_id = torch.arange(vllm_batch.num_actions)
                vllm_gap = logprob_gap(model, vllm_batch.to(device))  # vLLM was given the updated weights too
                summary |= {f"vllm_{k}": v for k, v in vllm_gap.items()}
                say(f"log-prob gap, vLLM vs training (both with the updated weights): mean |gap| "
                    f"{vllm_gap['logp_gap_mean_abs']:.2e}, max {vllm_gap['logp_gap_max_abs']:.2e}")
            except Exception as error:  # noqa: BLE001  (report it; the HF figures above still stand)
                summary["vllm"] = f"failed: {type(error).__name__}: {error}"
                say(f"vLLM: {summary['vllm']}")
    else:
        summary["vllm"] = "skipped (no GPU)" if device.type != "cuda" else "off"
    print(json.dumps(summary, indent=2, default=str))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2, default=str))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
