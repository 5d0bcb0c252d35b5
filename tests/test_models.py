"""capo_train.models on a tiny random Llama (seconds), plus one slow SmolLM2 check."""

from __future__ import annotations

import importlib.util

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from capo_train import models as M
from markers import needs_smollm2

needs_peft = pytest.mark.skipif(importlib.util.find_spec("peft") is None, reason="peft not installed")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny Llama + tokenizer saved like any HF checkpoint, so everything loads it by path."""
    model, tokenizer = M.make_tiny_llama(seed=0)
    d = tmp_path_factory.mktemp("tiny")
    model.save_pretrained(d)
    tokenizer.save_pretrained(d)
    return d


def batch(seed=1, R=3, S=12, vocab=256):
    """Rows padded on both sides, like the trainer's (prompt left-padded, response right-padded)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (R, S), generator=g)
    mask = torch.ones(R, S, dtype=torch.long)
    mask[0, :3] = 0  # left padding
    mask[1, -2:] = 0  # right padding
    mask[2, :1] = 0
    mask[2, -1:] = 0
    return ids, mask


def manual_logp(model, ids, mask):
    """Reference: full logits from the HF forward, log_softmax, gather token s from position s - 1."""
    logits = model(input_ids=ids, attention_mask=mask, position_ids=M.position_ids(mask)).logits.float()
    logp = torch.zeros(ids.shape)
    logp[:, 1:] = logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    p = logits[:, :-1].softmax(-1)
    entropy = torch.zeros(ids.shape)
    entropy[:, 1:] = -(p * logits[:, :-1].log_softmax(-1)).sum(-1)
    scored = torch.zeros_like(mask, dtype=torch.bool)
    scored[:, 1:] = mask[:, 1:].bool() & mask[:, :-1].bool()
    return logp * scored, entropy * scored, logits


def test_load_actor_by_path(tiny_dir):
    model, tokenizer = M.load_actor(tiny_dir)
    original, _ = M.make_tiny_llama(seed=0)
    ids, mask = batch()
    with torch.no_grad():
        assert torch.equal(
            model(input_ids=ids, attention_mask=mask).logits,
            original(input_ids=ids, attention_mask=mask).logits,
        )
    assert tokenizer.padding_side == "left" and tokenizer.pad_token_id == tokenizer.eos_token_id
    assert "<|im_start|>assistant" in tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    with pytest.raises(OSError):  # local_files_only: an uncached hub id fails at once, never downloads
        M.load_actor("capo-gym/no-such-model")


def test_logp_entropy_values_alignment(tiny_dir):
    ac, _ = M.build_actor_critic(tiny_dir, critic="shared")
    ids, mask = batch()
    out = ac(ids, mask, need_values=True, need_entropy=True)
    want_logp, want_entropy, _ = manual_logp(ac.actor, ids, mask)
    assert out.logp.shape == out.entropy.shape == out.values.shape == ids.shape
    torch.testing.assert_close(out.logp, want_logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.entropy, want_entropy, atol=1e-5, rtol=0)
    assert (out.logp[:, 0] == 0).all() and (out.logp[mask == 0] == 0).all()

    # values[:, s] = head(final hidden state at s): it depends on tokens <= s only.
    hidden = ac.actor(
        input_ids=ids, attention_mask=mask, position_ids=M.position_ids(mask), output_hidden_states=True
    )
    torch.testing.assert_close(out.values, ac.critic.head(hidden.hidden_states[-1]))
    s = 6
    changed = ids.clone()
    changed[:, s + 1 :] = (changed[:, s + 1 :] + 1) % 256
    out2 = ac(changed, mask, need_values=True)
    torch.testing.assert_close(out2.values[:, : s + 1], out.values[:, : s + 1])
    torch.testing.assert_close(out2.logp[:, : s + 1], out.logp[:, : s + 1])
    assert not torch.allclose(out2.values[2, s + 1 :], out.values[2, s + 1 :])

    # Padding does not change a row's numbers (position ids follow the mask, as in generate()).
    alone = ac(ids[0:1, 3:], mask[0:1, 3:], need_values=True)
    torch.testing.assert_close(alone.logp, out.logp[0:1, 3:], atol=1e-5, rtol=0)
    torch.testing.assert_close(alone.values, out.values[0:1, 3:], atol=1e-5, rtol=0)


def test_chunked_equals_unchunked_with_grads(tiny_dir):
    ids, mask = batch()
    results = []
    for chunk, recompute in ((3, True), (3, False), (10_000, False)):
        ac, _ = M.build_actor_critic(tiny_dir, critic=None)
        out = ac(ids, mask, need_values=False, need_entropy=True, chunk=chunk, recompute=recompute)
        (out.logp.sum() + out.entropy.sum()).backward()
        results.append(
            (out.logp.detach(), out.entropy.detach(), [p.grad.clone() for p in ac.actor.parameters()])
        )
    lp_b = results[-1][0]
    for lp_a, ent_a, g_a in results[:-1]:
        torch.testing.assert_close(lp_a, lp_b)
        torch.testing.assert_close(ent_a, results[-1][1])
        for a, b in zip(g_a, results[-1][2]):
            torch.testing.assert_close(a, b)

    # logp_mask scores a subset (e.g. the response) and leaves the rest 0.
    ac, _ = M.build_actor_critic(tiny_dir, critic=None)
    response = torch.zeros_like(mask)
    response[:, 7:] = 1
    part = ac(ids, mask, need_values=False, logp_mask=response)
    keep = response.bool()
    torch.testing.assert_close(part.logp[keep], lp_b[keep])
    assert (part.logp[~keep] == 0).all()


def value_loss_grads(ac, ids, mask, need_logp=True):
    out = ac(ids, mask, need_values=True, need_logp=need_logp)
    (out.values**2).mean().backward()
    actor_grads = [p.grad for p in ac.actor.parameters()]
    head_grads = [p.grad for p in ac.critic.head.parameters()]
    return actor_grads, head_grads


def test_shared_critic_detach_backbone(tiny_dir):
    ids, mask = batch()
    for need_logp in (True, False):
        ac, _ = M.build_actor_critic(tiny_dir, critic="shared", detach_backbone=True)
        actor_grads, head_grads = value_loss_grads(ac, ids, mask, need_logp)
        assert all(g is None for g in actor_grads)
        assert all(g is not None and g.abs().sum() > 0 for g in head_grads)

    ac, _ = M.build_actor_critic(tiny_dir, critic="shared", detach_backbone=False)
    actor_grads, head_grads = value_loss_grads(ac, ids, mask)
    assert sum(g.abs().sum() for g in actor_grads if g is not None) > 0
    assert list(ac.critic_parameters()) == list(ac.critic.head.parameters())


def test_separate_critic_starts_from_actor_checkpoint(tiny_dir):
    ac, _ = M.build_actor_critic(tiny_dir, critic="separate")
    actor_decoder = ac.actor.get_decoder().state_dict()
    for name, w in ac.critic.backbone.state_dict().items():
        assert torch.equal(w, actor_decoder[name])
    ids, mask = batch()
    actor_grads, head_grads = value_loss_grads(ac, ids, mask, need_logp=False)
    assert all(g is None for g in actor_grads) and all(g is not None for g in head_grads)
    assert any(p.grad is not None for p in ac.critic.backbone.parameters())


@needs_peft
def test_lora_trainable_params_and_reference(tiny_dir):
    lora = M.LoraSettings(r=4, alpha=8)
    ac, _ = M.build_actor_critic(tiny_dir, critic="shared", lora=lora)
    trainable = [n for n, p in ac.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n or n.startswith("critic.head.") for n in trainable)

    base = M.load_reference(tiny_dir)
    assert not any(p.requires_grad for p in base.parameters()) and not base.training
    ids, mask = batch()
    base_logp = M.lm_logp(base, ids, mask)[0]
    torch.testing.assert_close(M.reference_logp(ac, ids, mask), base_logp)
    torch.testing.assert_close(
        M.score(ac, ids, mask, need_values=False).logp, base_logp
    )  # LoRA B starts at 0

    opt = torch.optim.Adam(ac.actor_parameters(), lr=1e-2)
    (-ac(ids, mask, need_values=False).logp.sum()).backward()
    opt.step()
    after = M.score(ac, ids, mask, need_values=False).logp
    assert not torch.allclose(after, base_logp)
    torch.testing.assert_close(M.reference_logp(ac, ids, mask), base_logp)
    torch.testing.assert_close(M.score(ac, ids, mask, need_values=False).logp, after)  # adapters back on
    torch.testing.assert_close(M.reference_logp(ac, ids, mask, reference=base), base_logp)

    no_lora, _ = M.build_actor_critic(tiny_dir, critic=None)
    with pytest.raises(ValueError):
        M.reference_logp(no_lora, ids, mask)


@pytest.mark.parametrize(
    "critic,lora",
    [
        ("shared", None),
        ("separate", None),
        pytest.param("shared", M.LoraSettings(r=4), marks=needs_peft),
        pytest.param("separate", M.LoraSettings(r=4), marks=needs_peft),
    ],
)
def test_save_load_round_trip(tiny_dir, tmp_path, critic, lora):
    ac, tokenizer = M.build_actor_critic(tiny_dir, critic=critic, lora=lora)
    ids, mask = batch()
    params = list(ac.actor_parameters()) + list(ac.critic_parameters())
    opt = torch.optim.Adam(params, lr=1e-2)  # move every weight away from its initial value first
    out = ac(ids, mask, need_values=True)
    (-out.logp.sum() + out.values.square().sum()).backward()
    opt.step()
    before = M.score(ac, ids, mask, need_values=True)

    M.save_checkpoint(tmp_path, ac, tokenizer)
    assert not list(tmp_path.rglob("*.bin")) and list(tmp_path.rglob("*.safetensors"))
    if lora is not None:
        assert not list(tmp_path.rglob("model.safetensors"))  # adapters only
    loaded, _ = M.load_checkpoint(tmp_path)
    after = M.score(loaded, ids, mask, need_values=True)
    torch.testing.assert_close(after.logp, before.logp, atol=1e-6, rtol=0)
    torch.testing.assert_close(after.values, before.values, atol=1e-6, rtol=0)
    assert sorted(n for n, p in loaded.named_parameters() if p.requires_grad) == sorted(
        n for n, p in ac.named_parameters() if p.requires_grad
    )


@pytest.mark.parametrize("lora", [None, pytest.param(M.LoraSettings(r=4), marks=needs_peft)])
def test_exported_actor_is_a_plain_model_with_the_trained_weights(tiny_dir, tmp_path, lora):
    ac, tokenizer = M.build_actor_critic(tiny_dir, critic="shared", lora=lora)
    ids, mask = batch()
    opt = torch.optim.Adam(list(ac.actor_parameters()), lr=1e-2)
    (-ac(ids, mask, need_values=False).logp.sum()).backward()
    opt.step()
    before = M.score(ac, ids, mask, need_values=False).logp
    M.save_checkpoint(tmp_path / "ckpt", ac, tokenizer)
    M.export_actor(tmp_path / "ckpt", tmp_path / "model")
    assert not (tmp_path / "model" / "adapter_config.json").exists()  # merged: no peft folder
    actor, _ = M.load_actor(tmp_path / "model")
    after = M.score(M.ActorCritic(actor), ids, mask, need_values=False).logp
    torch.testing.assert_close(after, before, atol=1e-5, rtol=0)


def test_gradient_checkpointing_same_grads(tiny_dir):
    ids, mask = batch()
    grads = []
    for gc in (False, True):
        ac, _ = M.build_actor_critic(tiny_dir, critic=None, gradient_checkpointing=gc)
        assert any(getattr(m, "gradient_checkpointing", False) for m in ac.modules()) == gc
        ac.train()
        ac(ids, mask, need_values=False).logp.sum().backward()
        grads.append([p.grad for p in ac.actor.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


@pytest.mark.slow
@needs_smollm2
def test_smollm2_converts_and_answers():
    """Converts once into $CAPO_DATA_DIR (later runs reuse it), then checks chat template, greedy answer
    and that our log-probs match the HF logits on the real 49k vocabulary."""
    from capo_train.models.smollm2 import ensure_smollm2

    path = ensure_smollm2()
    assert ensure_smollm2() == path
    ac, tokenizer = M.build_actor_critic(path, critic="shared")
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert prompt.endswith("<|im_start|>assistant\n")
    enc = tokenizer([prompt], return_tensors="pt")
    with torch.no_grad():
        gen = ac.actor.generate(**enc, max_new_tokens=16, do_sample=False)
    assert "Paris" in tokenizer.decode(gen[0, enc.input_ids.shape[1] :], skip_special_tokens=True)

    mask = torch.ones_like(gen)
    with torch.no_grad():
        out = ac(gen, mask, need_values=True, chunk=7)
        want, _, _ = manual_logp(ac.actor, gen, mask)
    torch.testing.assert_close(out.logp, want, atol=1e-4, rtol=0)
    assert out.values.shape == gen.shape
