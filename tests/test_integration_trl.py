"""capo envs in TRL's GRPOTrainer (capo_envs.integrations.trl): the class's tools, its answers to bad calls,
and a few real GRPO steps on CPU on SynthChain and SynthHop, with the env's reward reaching the trainer.

The model is a tiny random Llama over the byte-level test tokenizer with TRL's own Qwen2.5 chat template
(Hermes ``<tool_call>`` blocks, which TRL parses), first taught to write one fixed tool call, so that its
rollouts call the env's tools and the env pays rewards; nothing is downloaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

pytest.importorskip("trl")
torch = pytest.importorskip("torch")

from capo_envs.integrations.trl import EPISODE_OVER, environment_factory, task_dataset  # noqa: E402

CHAIN_KWARGS = {"k": 2, "choices": 2}
# one decision: the fixed call ends the episode, and SynthChain pays only at the end (1 when the door is right)
CHAIN_ONE_STEP = {"k": 1, "choices": 2}
# a short observation (10 passages of 40 characters) and a reward for supporting passages a search shows, so
# that one fixed query earns some reward on about half the questions
HOP_KWARGS = {"size": "tiny", "k": 10, "max_passage_chars": 40, "support_reward": 0.5}


def test_importing_capo_envs_loads_neither_trainer():
    code = ("import sys, capo_envs, capo_envs.integrations\n"
            "print(sorted(m for m in ('trl', 'verifiers', 'torch', 'capo_train') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_tools_are_the_env_actions_with_docstrings():
    from transformers.utils import get_json_schema

    hop = environment_factory("capo/SynthHop-v0", **HOP_KWARGS)()
    schemas = {s["function"]["name"]: s["function"] for s in (get_json_schema(hop.search), get_json_schema(hop.answer))}
    assert schemas["search"]["parameters"]["required"] == ["query"]
    assert "search the knowledge base" in schemas["search"]["description"].lower()
    assert schemas["answer"]["parameters"]["properties"]["answer"]["type"] == "string"
    assert type(hop).__name__ == "SynthHopv0"


def test_an_episode_through_the_tools_and_bad_calls():
    chain_class = environment_factory("capo/SynthChain-v0", **CHAIN_KWARGS)
    chain = chain_class()
    first = chain.reset(task_id="synthchain-0-train-3", prompt=[])
    assert first.startswith("Step 1/2") and "calling the tools" in first
    assert "exactly one argument" in chain.go()  # no step taken
    assert "exactly one argument" in chain.go("left", door="right")
    assert chain.steps == 0
    assert chain.go(door=["left"]).startswith("Invalid action")  # a non-string argument is an invalid step
    assert chain.invalid_actions == 1 and chain.steps == 1
    assert chain.go(door="left").endswith(EPISODE_OVER)
    assert chain.done and chain.terminated and not chain.truncated
    assert chain.get_reward() == chain.episode_return == chain.metrics["correct_fraction"]
    assert chain.go(door="left") == EPISODE_OVER
    with pytest.raises(ValueError, match="cannot make env"):
        environment_factory("capo/NoSuchEnv-v0")
    with pytest.raises(ValueError, match="reward must be"):
        environment_factory("capo/SynthChain-v0", reward="nope")
    rows = task_dataset(chain_class, 3)
    assert rows["task_id"] == ["synthchain-0-train-0", "synthchain-0-train-1", "synthchain-0-train-2"]



def test_success_reward_reads_the_episode_metrics():
    """reward="success": 0 until the episode ends, then metrics' em, whatever the shaped return was."""
    hop_class = environment_factory("capo/SynthHop-v0", reward="success", **HOP_KWARGS)
    row = task_dataset(hop_class, 1, start=5)[0]  # the fixed query shows a supporting passage here
    wrong = hop_class()
    wrong.reset(**row)
    wrong.search("capital city country founded year")
    assert wrong.episode_return == 0.5 and not wrong.done and wrong.get_reward() == 0.0
    wrong.answer("no such place")
    assert wrong.done and wrong.metrics["em"] == 0.0 and wrong.get_reward() == 0.0 < wrong.episode_return
    expert = hop_class()  # the env's expert, through the tools: the episode ends answered right
    expert.reset(**row)
    while not expert.done:
        action = expert.env.unwrapped.protocol.parse(expert.env.unwrapped.expert_action()).action
        getattr(expert, action.name)(*action.args.values())
    assert expert.metrics["em"] == 1.0 and expert.get_reward() == expert.success == 1.0

def tool_call(name: str, arg: str, value: str) -> str:
    return '<tool_call>\n{"name": "%s", "arguments": {"%s": "%s"}}\n</tool_call><|im_end|>' % (name, arg, value)


def tiny_model_and_tokenizer(seed: int = 0):
    """A tiny random Llama (4096 positions: byte tokens make long prompts) and the byte-level tokenizer with
    TRL's Qwen2.5 template, one whose tool calls TRL knows how to parse."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl.chat_template_utils import qwen2_5_chat_template

    from capo_train.models.tiny import make_tiny_tokenizer

    torch.manual_seed(seed)
    tokenizer = make_tiny_tokenizer()
    tokenizer.chat_template = qwen2_5_chat_template
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True)
    return LlamaForCausalLM(config), tokenizer


def teach_tool_call(trainer, env_class, call_text: str, max_steps: int = 200) -> None:
    """Teach the trainer's model, by up to ``max_steps`` supervised steps (10-25 s), to answer the first prompts of the
    trainer's tasks, rendered exactly as the trainer renders them (its tool list, its training chat template), with
    ``call_text``. Greedy decoding then writes the call; sampling at temperature 1 does not yet (hence the
    trainer's low temperature)."""
    env = env_class()
    # in TRL's order: it reads the tools with inspect.getmembers, which sorts them by name
    tools = [getattr(env, name) for name in sorted(tool.name for tool in env_class.tools)]
    rows = []
    for row in trainer.train_dataset:
        rendered = trainer.processing_class.apply_chat_template(
            [{"role": "user", "content": env.reset(**row)}], tools=tools, chat_template=trainer.chat_template,
            add_generation_prompt=True, tokenize=True, return_dict=True)
        rows.append(list(rendered["input_ids"]))
    target = trainer.processing_class.encode(call_text, add_special_tokens=False)
    model = trainer.model
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    losses = [float("inf")] * len(rows)
    for step in range(max_steps):
        prompt = rows[step % len(rows)]
        ids = torch.tensor([prompt + target])
        labels = ids.clone()
        labels[0, : len(prompt)] = -100
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses[step % len(rows)] = loss.item()
        if max(losses) < 0.02:  # on every prompt: the call is then written greedily, byte for byte
            break


@pytest.mark.slow
@pytest.mark.parametrize(
    "env_id, kwargs, call, tasks",
    # SynthChain: the first 8 tasks, 5 of whose doors are "left"; SynthHop: tasks 5 and 6, where the fixed
    # query shows a supporting passage (on tasks 0-4 and 7 it shows none)
    [("capo/SynthChain-v0", CHAIN_ONE_STEP, ("go", "door", "left"), slice(0, 8)),
     ("capo/SynthHop-v0", HOP_KWARGS, ("search", "query", "capital city country founded year"), slice(5, 7))],
    ids=["SynthChain", "SynthHop"],
)
def test_grpo_trainer_trains_on_the_env_and_gets_its_reward(env_id, kwargs, call, tasks, tmp_path, monkeypatch):
    """Two GRPO steps (4 tasks x 4 generations each); the reward TRL logs for the env is the mean of the
    returns the env paid, and some of them are positive."""
    from trl import GRPOConfig, GRPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    torch.set_num_threads(1)
    started = time.time()
    base = environment_factory(env_id, **kwargs)
    paid: list[float] = []

    class Recorded(base):
        def get_reward(self) -> float:
            reward = super().get_reward()
            assert reward == self.episode_return  # TRL's reward is the env's own return, not a stand-in
            paid.append(reward)
            return reward

    model, tokenizer = tiny_model_and_tokenizer()
    args = GRPOConfig(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=512, max_tool_calling_iterations=2, learning_rate=1e-4,
                      logging_steps=1, report_to="none", use_cpu=True, bf16=False, save_strategy="no",
                      temperature=0.05, seed=0, dataloader_num_workers=0)
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=args,
                          train_dataset=task_dataset(Recorded, tasks.stop - tasks.start, start=tasks.start),
                          environment_factory=Recorded)
    teach_tool_call(trainer, base, tool_call(*call))
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "rewards/Recorded/mean" in entry]
    assert len(logged) == 2 and len(paid) == 16, (logged, paid)
    for step, entry in enumerate(logged):  # each optimizer step's logged mean is that step's 8 rollouts'
        assert entry["rewards/Recorded/mean"] == pytest.approx(sum(paid[8 * step: 8 * step + 8]) / 8)
    assert max(paid) > 0, paid
    assert any(entry.get("tools/call_frequency", 0) > 0 for entry in logged), logged
    print(json.dumps({"env": env_id, "rewards": paid, "seconds": round(time.time() - started, 1)}))


@pytest.mark.slow
def test_the_docs_example_runs_as_written(tmp_path):
    """docs/trl.md's example, run as written but for the model (a saved tiny one instead of a download) and
    one step instead of 100: it trains (on CPU here) and TRL logs the env's reward under the name the page
    gives. It runs as a script in its own process: TRL's trainer changes process-wide torch state that made
    later tests' first-update ratios drift past 1e-3 (test_trainer's rollout-temperature test)."""
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "trl.md").read_text()
    code = re.findall(r"```python\n(.*?)```", page, re.S)[0]
    assert '"Qwen/Qwen3-0.6B"' in code and "max_steps=100" in code, code
    model, tokenizer = tiny_model_and_tokenizer()
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    code = code.replace('"Qwen/Qwen3-0.6B"', repr(str(tmp_path / "model"))).replace("max_steps=100", "max_steps=1")
    check = ("\nimport json\nprint('RESULT', json.dumps({'step': trainer.state.global_step, "
             "'logged': any('rewards/SynthHopv0/mean' in e for e in trainer.state.log_history)}))\n")
    script = tmp_path / "trl_example.py"
    script.write_text(code + check)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1", "OMP_NUM_THREADS": "1"})
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    assert json.loads(lines[-1][len("RESULT "):]) == {"step": 1, "logged": True}
