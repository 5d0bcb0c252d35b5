"""``rollout.frozen_layers_from_rollout``: with LoRA on the last layers only, the HF rollout records the hidden
state entering the first trainable layer at every token it feeds (``HFBackend(keep_frozen_states=True)``),
and the update runs only the trainable layers on them. The update's log-probs, entropies, values and
gradients equal those of a full forward, in every row layout (concatenated states packed or one row per
action, window states one row per action), with left-padded batches, reused prefixes, stop strings and
gradient checkpointing. States shifted by one position fail these checks, so they do see misalignment."""

from __future__ import annotations

import copy

import gymnasium as gym
import pytest
import torch

import capo_envs  # noqa: F401  (registers the ids)
from capo_train.algorithms import get
from capo_train.backends import HFBackend
from capo_train.config import TrainConfig
from capo_train.models import LoraSettings, build_actor_critic, make_tiny_llama
from capo_train.models import logprobs as logprobs_module
from capo_train.models.logprobs import _causal_lm, frozen_prefix_layers
from capo_train.rollout import RolloutSettings, collect
from capo_train.rows import action_features, build_rows, gather_actions, pad_frozen_states, row_frozen_states
from capo_train.update import compute_targets, shift_right, update

LAYERS, LORA_LAST = 4, 2  # LoRA on layers 2 and 3: layers 0 and 1 are frozen
LAYOUTS = [("concat", "packed"), ("concat", "per_action"), ("window", "per_action")]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama-4")
    model, tokenizer = make_tiny_llama(hidden_size=32, num_layers=LAYERS, seed=0)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def make_model(model_dir, *, last_layers=LORA_LAST, gradient_checkpointing=False):
    torch.manual_seed(0)
    model, tokenizer = build_actor_critic(model_dir, critic="shared", gradient_checkpointing=gradient_checkpointing,
                                          lora=LoraSettings(r=4, alpha=8, last_layers=last_layers))
    # Adapters that change the outputs (LoRA B starts at 0) and a value head that varies across positions, so
    # that a wrong state at any position shows in the log-probs and values.
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.2)
    torch.nn.init.normal_(model.critic.head.linear.weight, std=1.0)
    return model, tokenizer


@pytest.fixture(scope="module")
def actor_critic(model_dir):
    return make_model(model_dir)


def full_forward_states(model, ids: list[int]) -> torch.Tensor:
    """``[len(ids), H]``: the input of the first trainable layer in one plain forward over ``ids``."""
    decoder = _causal_lm(model.actor).get_decoder()
    seen = {}

    def keep(module, args, kwargs):
        seen["x"] = args[0] if args else kwargs["hidden_states"]

    hook = decoder.layers[frozen_prefix_layers(model.actor)].register_forward_pre_hook(keep, with_kwargs=True)
    try:
        with torch.no_grad():
            model.actor(input_ids=torch.tensor([ids]))
    finally:
        hook.remove()
    return seen["x"][0]


def rollout(model, tokenizer, state: str):
    envs = [gym.make("capo/SynthHop-v0", size="tiny", k=1, max_passage_chars=40) for _ in range(3)]
    # window states reuse the head their prompts share with the last sequences, as the trainer's default does
    backend = HFBackend(model.actor, tokenizer, batch_size=3, keep_features=True, keep_frozen_states=True,
                        common_prefixes=state == "window")
    settings = RolloutSettings(max_action_tokens=12, max_prompt_tokens=4000, state=state, window=1)
    trajs = collect(envs, backend, tokenizer, settings, tasks_per_batch=3, group_size=1, seed=5)
    return trajs, backend


def test_model_has_frozen_prefix(actor_critic, model_dir):
    model, _ = actor_critic
    assert frozen_prefix_layers(model.actor) == LAYERS - LORA_LAST
    everywhere, _ = make_model(model_dir, last_layers=0)  # LoRA on every layer: nothing to skip
    assert frozen_prefix_layers(everywhere.actor) is None
    full, _ = build_actor_critic(model_dir, critic="shared")  # a full fine-tune: nothing frozen
    assert frozen_prefix_layers(full.actor) is None


def test_backend_records_the_states_of_a_full_forward(actor_critic):
    """Prompts of different lengths in one left-padded batch (and over two batches), a stop string, then a
    second call whose prompts extend the first call's sequences (their states come from the reused prefix
    for the cached positions): every generation's states equal a plain forward over prompt + tokens[:-1]."""
    model, tokenizer = actor_critic
    prompts = [list(range(40, 40 + n)) for n in (5, 17, 9)]
    probe = HFBackend(model.actor, tokenizer, keep_frozen_states=True).generate(
        prompts[:1], stop=[], max_new_tokens=6, greedy=True)[0]
    stop = tokenizer.decode(probe.token_ids[2:3])  # greedy repeats itself: this stops the first prompt early
    backend = HFBackend(model.actor, tokenizer, batch_size=2, keep_frozen_states=True)
    first = backend.generate(prompts, stop=[stop], max_new_tokens=6, greedy=True)
    assert first[0].finish_reason == "stop" and len(first[0].token_ids) <= 3  # cut short by the stop string
    second = backend.generate([p + g.token_ids + [70, 71, 72] for p, g in zip(prompts, first)],
                              stop=[], max_new_tokens=4, greedy=True)
    assert backend.reused_tokens > 0
    for p, g in [*zip(prompts, first), *((p + f.token_ids + [70, 71, 72], g) for p, f, g in zip(prompts, first, second))]:
        ids = p + g.token_ids[:-1]
        assert g.frozen_states.shape == (len(ids), model.actor.config.hidden_size)
        assert g.frozen_states.dtype == next(model.actor.parameters()).dtype
        torch.testing.assert_close(g.frozen_states, full_forward_states(model, ids), atol=1e-5, rtol=1e-5)


def test_states_of_a_reused_common_head_are_those_of_a_full_forward(actor_critic):
    """``common_prefixes``: a second call's prompts share only a head with the first call's sequences (as a
    window state's do); the cut prefix's cached states and the new positions' still equal a plain forward."""
    model, tokenizer = actor_critic
    prompts = [list(range(40, 40 + n)) for n in (9, 17)]
    backend = HFBackend(model.actor, tokenizer, common_prefixes=True, keep_frozen_states=True)
    first = backend.generate(prompts, stop=[], max_new_tokens=4, greedy=True)
    second_prompts = [p[:6] + [80, 81, 82] for p in prompts]  # the first 6 tokens shared, then new ones
    second = backend.generate(second_prompts, stop=[], max_new_tokens=4, greedy=True)
    assert backend.reused_tokens == 12
    for p, g in [*zip(prompts, first), *zip(second_prompts, second)]:
        torch.testing.assert_close(g.frozen_states, full_forward_states(model, p + g.token_ids[:-1]), atol=1e-5, rtol=1e-5)


def test_without_frozen_layers_nothing_is_recorded(model_dir):
    model, tokenizer = make_model(model_dir, last_layers=0)
    backend = HFBackend(model.actor, tokenizer, keep_frozen_states=True)
    assert backend.frozen_layers is None
    assert backend.generate([[40, 41, 42]], stop=[], max_new_tokens=3)[0].frozen_states is None


def passes(model, batch, states):
    out = model(batch.input_ids, batch.attention_mask, need_values=True, need_entropy=True,
                logp_mask=batch.action_index >= 0, frozen_states=states)
    mask = batch.action_mask.bool()
    return {
        "logp": gather_actions(out.logp, batch)[mask],
        "entropy": gather_actions(out.entropy, batch)[mask],
        "boundary_values": out.values[batch.boundary_row, batch.boundary_pos],
        "token_values": gather_actions(shift_right(out.values), batch)[mask],
    }


@pytest.mark.parametrize("state,layout", LAYOUTS)
def test_update_pass_on_recorded_states_equals_the_full_forward(actor_critic, state, layout):
    model, tokenizer = actor_critic
    trajs, backend = rollout(model, tokenizer, state)
    assert sum(len(t.actions) for t in trajs) >= 4  # several turns: multi-turn rows and reused prefixes
    batch = build_rows(trajs, layout, backend.pad_id)
    states = row_frozen_states(trajs, layout)
    assert states is not None and len(states) == batch.num_rows
    padded = pad_frozen_states(states, batch.input_ids.shape[1])
    model.eval()
    with torch.no_grad():
        full, cut = passes(model, batch, None), passes(model, batch, padded)
        # the same states one position late (an off-by-one in the recording): the check must see it
        shifted = pad_frozen_states([torch.cat([s[:1], s[:-1]]) for s in states], batch.input_ids.shape[1])
        wrong = passes(model, batch, shifted)
    for key in full:
        torch.testing.assert_close(cut[key], full[key], atol=1e-4, rtol=1e-4)
    assert (wrong["logp"] - full["logp"]).abs().max() > 1e-2
    assert (wrong["boundary_values"] - full["boundary_values"]).abs().max() > 1e-2
    # and the recorded log-probs (the rollout's own) are what the cut pass gives
    old = batch.old_logp[batch.action_mask.bool()]
    torch.testing.assert_close(cut["logp"], old, atol=1e-4, rtol=1e-4)


def test_concatenated_states_share_one_tensor_per_episode(actor_critic):
    """Each action's states become a view of the next action's (one tensor per episode, not one per turn),
    covering its whole row, last action token included; window states cannot share (the prompt is rebuilt)."""
    model, tokenizer = actor_critic
    trajs, _ = rollout(model, tokenizer, "concat")
    for traj in trajs:
        acts = traj.actions
        for a, nxt in zip(acts, acts[1:]):
            assert a.frozen_states.shape[0] == len(a.prompt_ids) + len(a.action_ids)
            assert a.frozen_states.untyped_storage().data_ptr() == acts[-1].frozen_states.untyped_storage().data_ptr()
        assert acts[-1].frozen_states.shape[0] == len(acts[-1].prompt_ids) + len(acts[-1].action_ids) - 1
    window, _ = rollout(model, tokenizer, "window")
    assert all(a.frozen_states.shape[0] == len(a.prompt_ids) + len(a.action_ids) - 1
               for t in window for a in t.actions)


def test_rows_without_states_fall_back(actor_critic):
    model, tokenizer = actor_critic
    trajs, _ = rollout(model, tokenizer, "concat")
    assert row_frozen_states(trajs, "packed") is not None
    last = trajs[0].actions[-1]
    kept = last.frozen_states
    last.frozen_states = kept[:-2]  # too short for its row: not these states
    assert row_frozen_states(trajs, "packed") is None and row_frozen_states(trajs, "per_action") is None
    last.frozen_states = None  # a backend that records none (vLLM, OpenAI)
    assert row_frozen_states(trajs, "per_action") is None
    last.frozen_states = kept


def config_for_update(layout: str) -> TrainConfig:
    config = TrainConfig()
    config.model.critic = "shared"
    config.rollout.layout = layout
    config.optim.minibatch_rows = 2  # several mini-batches: states follow their rows through select_rows
    config.optim.grad_clip = 1e9
    return config


@pytest.mark.parametrize("gradient_checkpointing", [False, True])
@pytest.mark.parametrize("state,layout", LAYOUTS)
def test_update_gradients_and_losses_equal_the_full_forward(model_dir, state, layout, gradient_checkpointing):
    """``update.update`` (CAPO, shared critic) with and without the rows' states: the same losses and
    statistics, and the same gradients in every LoRA weight and in the value head (an optimizer with lr 0
    leaves the last mini-batch's gradients in place and the weights as they were)."""
    model, tokenizer = make_model(model_dir, gradient_checkpointing=gradient_checkpointing)
    trajs, backend = rollout(model, tokenizer, state)
    batch = build_rows(trajs, layout, backend.pad_id)
    batch.action_id = torch.arange(batch.num_actions)
    algo = get("capo").bind({})
    targets = compute_targets(model, algo, batch, torch.zeros(batch.num_actions), state_features=action_features(trajs))
    config = config_for_update(layout)
    results = []
    for states in (None, row_frozen_states(trajs, layout)):
        twin = copy.deepcopy(model)
        optimizers = {name: torch.optim.SGD(params, lr=0.0) for name, params in
                      (("actor", list(twin.actor_parameters())), ("critic", list(twin.critic_parameters())))}
        batch.frozen_states = states
        stats = update(twin, optimizers, algo, batch, targets, config, torch.Generator().manual_seed(3))
        grads = {n: p.grad.clone() for n, p in twin.named_parameters() if p.requires_grad and p.grad is not None}
        results.append((stats, grads))
    (stats_full, grads_full), (stats_cut, grads_cut) = results
    assert set(stats_full) == set(stats_cut)
    for key in stats_full:
        assert stats_cut[key] == pytest.approx(stats_full[key], rel=1e-4, abs=1e-5), key
    lora = [n for n in grads_full if "lora_" in n]
    assert len(lora) == 2 * 7 * LORA_LAST and any("critic" in n for n in grads_full)
    assert set(grads_full) == set(grads_cut)
    for name in grads_full:
        torch.testing.assert_close(grads_cut[name], grads_full[name], atol=1e-5, rtol=1e-4)
    assert max(g.abs().max() for n, g in grads_full.items() if "lora_" in n) > 1e-4  # gradients that say something


def test_trainer_runs_only_the_trainable_layers_with_the_key(model_dir, tmp_path, monkeypatch):
    """One RL iteration with ``rollout.frozen_layers_from_rollout=true``: every actor pass of the update ran
    the cut decoder, and the iteration's losses are those of the same iteration without the key."""
    from capo_train.config import load_config
    from capo_train.trainer import train

    calls = []
    cut = logprobs_module._trainable_layers_hidden
    monkeypatch.setattr(logprobs_module, "_trainable_layers_hidden",
                        lambda *args: calls.append(args[1].shape) or cut(*args))
    common = [f"model.path={model_dir}", "iterations=1", "env.id=capo/SynthHop-v0",
              "env.kwargs={size: tiny, k: 1, max_passage_chars: 40}", "rollout.tasks_per_batch=2",
              "rollout.group_size=2", "rollout.max_action_tokens=8", "rollout.max_prompt_tokens=2000",
              "optim.minibatch_rows=2", "eval_every=0", "sft.episodes=0", "log_tensorboard=false",
              f"model.lora_last_layers={LORA_LAST}", "algo=capo"]
    records = []
    for on in (False, True):
        out = tmp_path / f"run_{on}"
        train(load_config(None, [*common, f"out_dir={out}", f"rollout.frozen_layers_from_rollout={str(on).lower()}"]),
              progress=False)
        records.append((out / "log.jsonl").read_text().splitlines()[-1])
        if not on:
            assert calls == []
    assert len(calls) >= 2  # the update's mini-batches (the critic's values come from the rollout's features)
    import json

    off, on = (json.loads(r) for r in records)
    for key in ("actor/loss", "critic/loss", "rollout/reward_mean"):
        assert on[key] == pytest.approx(off[key], rel=1e-3, abs=1e-4), key


def test_reference_pass_on_recorded_states_equals_the_full_forward(actor_critic, tmp_path):
    """The KL reference's log-probs from the rollout's recorded states equal a whole pass, for the actor with its
    adapters off and for a reference merged from it (as after a warm start); a reference whose leading layers
    differ from the actor's frozen ones gets a whole pass, not the recorded states."""
    from capo_train.models.actor_critic import load_reference
    from capo_train.models.scoring import reference_logp
    from capo_train.setup import freeze_warm_start

    model, tokenizer = actor_critic
    trajs, backend = rollout(model, tokenizer, "window")
    batch = build_rows(trajs, "per_action", backend.pad_id)
    states = pad_frozen_states(row_frozen_states(trajs, "per_action"), batch.input_ids.shape[1])
    mask = batch.action_index >= 0
    freeze_warm_start(model, tokenizer, tmp_path / "warm")
    merged = load_reference(tmp_path / "warm")
    shifted = pad_frozen_states([torch.cat([s[:1], s[:-1]]) for s in row_frozen_states(trajs, "per_action")],
                                batch.input_ids.shape[1])
    with torch.no_grad():
        for reference in (None, merged):
            full = reference_logp(model, batch.input_ids, batch.attention_mask, reference=reference, logp_mask=mask)
            cut = reference_logp(model, batch.input_ids, batch.attention_mask, reference=reference, logp_mask=mask,
                                 frozen_states=states)
            torch.testing.assert_close(cut[mask], full[mask], atol=1e-4, rtol=1e-4)
            wrong = reference_logp(model, batch.input_ids, batch.attention_mask, reference=reference, logp_mask=mask,
                                   frozen_states=shifted)
            assert (wrong[mask] - full[mask]).abs().max() > 1e-2  # the recorded states were used
        # the merged reference is the adapted actor, not the adapters-off one
        assert (reference_logp(model, batch.input_ids, batch.attention_mask, reference=merged, logp_mask=mask)[mask]
                - reference_logp(model, batch.input_ids, batch.attention_mask, logp_mask=mask)[mask]).abs().max() > 1e-2
        other = copy.deepcopy(merged)
        _causal_lm(other).get_decoder().layers[0].mlp.down_proj.weight.add_(0.1)  # a different frozen layer
        full = reference_logp(model, batch.input_ids, batch.attention_mask, reference=other, logp_mask=mask)
        given = reference_logp(model, batch.input_ids, batch.attention_mask, reference=other, logp_mask=mask,
                               frozen_states=states)
        torch.testing.assert_close(given[mask], full[mask])
