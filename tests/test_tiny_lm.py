"""The tiny SynthHop LM: its tokenizer, its folder, and that the trainer's code paths accept it."""

from __future__ import annotations

import itertools
import json

import pytest
import torch

from capo_train.models.tiny_lm import TINY_LM_META, build_tiny_lm, main, protocol_tokens, world_texts

TEST_SHAPE = {"size": "tiny", "model": "tiny", "vocab_size": 320, "hidden_size": 16, "num_layers": 1}


@pytest.fixture(scope="module")
def tiny_lm_dir(tmp_path_factory):
    return build_tiny_lm(tmp_path_factory.mktemp("tiny-lm") / "lm", **TEST_SHAPE)


@pytest.fixture(scope="module")
def loaded(tiny_lm_dir):
    from capo_train.models import load_actor

    return load_actor(tiny_lm_dir)


def test_the_folder_loads_with_load_actor_and_is_set_up_like_smollm2(tiny_lm_dir, loaded):
    model, tokenizer = loaded
    meta = json.loads((tiny_lm_dir / TINY_LM_META).read_text())
    assert len(tokenizer) == meta["vocab_size"] == model.config.vocab_size == 320 + len(protocol_tokens())
    assert model.config.hidden_size == 16 and model.config.num_hidden_layers == 1
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.bos_token == "<|im_start|>"
    assert tokenizer.pad_token_id == tokenizer.eos_token_id == model.config.pad_token_id
    assert tokenizer.padding_side == "left"
    assert model.config.tie_word_embeddings
    assert meta["parameters"] == sum(p.numel() for p in model.parameters())


def test_tokenizer_round_trips_synthhop_text(loaded):
    _, tokenizer = loaded
    texts = list(world_texts(0, "tiny"))
    for text in texts[:50] + texts[-50:] + ["Ünïcode — and emoji 🙂 still round-trip\n\ttabs"]:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == text


def test_a_name_has_the_same_tokens_in_an_action_and_in_a_passage(loaded):
    _, tokenizer = loaded

    def ids(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    def contains(seq, part):
        return any(seq[i : i + len(part)] == part for i in range(len(seq) - len(part) + 1))

    for name in ("Vrugard Sky", "1857"):
        assert contains(ids(f"<search>{name}</search>"), ids(name))
        assert contains(ids(f"was born in {name}."), ids(name))
        assert contains(ids(f"Question: Who founded {name}?"), ids(name))


def test_protocol_text_is_one_token_each(loaded):
    from capo_envs.core.protocol import make_protocol
    from capo_envs.qa.protocol import QA_TOOLS

    _, tokenizer = loaded
    instructions = make_protocol("tags", QA_TOOLS).instructions
    for text in ("<search>", "</search>", "<answer>", "</answer>", "<information>", instructions):
        assert len(tokenizer(text, add_special_tokens=False)["input_ids"]) == 1, text
    ids = tokenizer("<answer>unknown</answer>", add_special_tokens=False)["input_ids"]
    assert tokenizer.convert_ids_to_tokens([ids[0], ids[-1]]) == ["<answer>", "</answer>"]
    assert tokenizer.decode(ids) == "<answer>unknown</answer>"


def test_chat_format_concatenates_like_the_template(loaded):
    from capo_train.states import ChatFormat

    _, tokenizer = loaded
    fmt = ChatFormat(tokenizer)
    action = tokenizer("<search>Vrugard</search>", add_special_tokens=False)["input_ids"]
    state = fmt.first("Act with tags.", "Question: Who?") + action
    state += fmt.next_turn(action, "<information>x</information>")
    messages = [
        {"role": "system", "content": "Act with tags."},
        {"role": "user", "content": "Question: Who?"},
        {"role": "assistant", "content": "<search>Vrugard</search>"},
        {"role": "user", "content": "<information>x</information>"},
    ]
    expected = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False, add_generation_prompt=True)
    assert state == list(expected)
    assert tokenizer.decode(fmt.close) == "<|im_end|>\n"


def test_builds_are_deterministic(tiny_lm_dir, tmp_path):
    again = build_tiny_lm(tmp_path / "again", **TEST_SHAPE)
    assert (again / "tokenizer.json").read_text() == (tiny_lm_dir / "tokenizer.json").read_text()
    from safetensors.torch import load_file

    a, b = load_file(tiny_lm_dir / "model.safetensors"), load_file(again / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    other_seed = build_tiny_lm(tmp_path / "seed1", seed=1, **TEST_SHAPE)
    c = load_file(other_seed / "model.safetensors")
    assert not all(torch.equal(a[key], c[key]) for key in a)


def test_the_model_generates_through_the_rollout_backend(loaded):
    from capo_train.backends.hf import HFBackend
    from capo_train.states import ChatFormat

    model, tokenizer = loaded
    prompt = ChatFormat(tokenizer).first("Act with tags.", "Question: Who founded Vrugard Sky?")
    out = HFBackend(model, tokenizer, batch_size=2).generate(
        [prompt, prompt[3:]], stop=["</search>", "</answer>"], max_new_tokens=6, temperature=1.0, seed=0
    )
    assert len(out) == 2
    for gen in out:
        assert 1 <= len(gen.token_ids) <= 6 and len(gen.logprobs) == len(gen.token_ids)
        assert all(lp <= 0 for lp in gen.logprobs)


def test_cli_writes_a_folder(tmp_path, capsys):
    args = ["--out", str(tmp_path / "cli"), "--size", "tiny", "--model", "tiny", "--vocab-size", "300"]
    assert main(args + ["--no-protocol-tokens"]) == 0
    assert "parameters, vocabulary 300" in capsys.readouterr().out
    assert json.loads((tmp_path / "cli" / TINY_LM_META).read_text())["vocab_size"] == 300


def test_pretraining_reads_the_corpus_and_moves_the_weights(tiny_lm_dir, tmp_path):
    import math

    from safetensors.torch import load_file

    from capo_envs.qa.world import build_world
    from capo_train.models.tiny_lm import corpus_chats

    world = build_world(0, "tiny")
    chats = corpus_chats(0, "tiny")
    assert len(chats) == len(world.passages) + len(world.splits["train"])
    read = {m["content"] for chat in chats for m in chat}
    held_out = {f"Question: {t.question}" for t in world.splits["dev"] + world.splits["test"]}
    assert not held_out & read  # held-out questions are never read
    assert f"<search>{world.splits['train'][0].expert_queries[0]}</search>" in read

    pretrained = build_tiny_lm(tmp_path / "pre", pretrain_steps=3, pretrain_batch=4, **TEST_SHAPE)
    meta = json.loads((pretrained / TINY_LM_META).read_text())["pretrain"]
    assert meta["steps"] == 3 and math.isfinite(meta["loss_first"]) and math.isfinite(meta["loss_last"])
    a, b = load_file(tiny_lm_dir / "model.safetensors"), load_file(pretrained / "model.safetensors")
    assert not all(torch.equal(a[key], b[key]) for key in a)


def test_lr_factor_warms_up_then_decays():
    from capo_train.sft import lr_factor

    factors = [lr_factor(step, 20, 0.1, "cosine") for step in range(20)]
    assert factors[0] < factors[1] < 1.0  # two warm-up steps
    assert all(a >= b for a, b in itertools.pairwise(factors[2:])) and factors[-1] == pytest.approx(0.0, abs=1e-12)
    assert [lr_factor(step, 20, 0.0, "constant") for step in range(20)] == [1.0] * 20
    with pytest.raises(ValueError, match="lr_schedule"):
        lr_factor(0, 20, 0.0, "linear")


def test_behaviour_cloning_a_tiny_lm_with_the_from_scratch_options(tiny_lm_dir):
    import gymnasium as gym

    import capo_envs  # noqa: F401
    from capo_train.config import load_config
    from capo_train.models import build_actor_critic
    from capo_train.sft import behaviour_clone

    config = load_config(None, [
        f"model.path={tiny_lm_dir}", "model.lora=false", "sft.episodes=6", "sft.epochs=3", "sft.minibatch_rows=2",
        "sft.lr=1e-2", "sft.warmup_frac=0.2", "sft.lr_schedule=cosine", "sft.length_buckets=true",
        "sft.state_loss_coef=1.0",
    ])  # fmt: skip
    model, tokenizer = build_actor_critic(tiny_lm_dir, critic=None)
    env = gym.make("capo/SynthHop-v0", size="tiny", k=1, max_passage_chars=60)
    record = behaviour_clone(model, tokenizer, config, env)
    assert record["sft/steps"] == 9 and record["sft/expert_success"] == 1.0
    assert record["sft/loss_last"] < record["sft/loss_first"]
    assert record["sft/state_loss_last"] < record["sft/state_loss_first"]
