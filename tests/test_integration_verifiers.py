"""capo envs as verifiers multi-turn envs (capo_envs.integrations.verifiers): the dataset and the stepping,
then verifiers' own evaluation command, ``vf-eval``, on a capo id against ``capo serve`` (the project's
OpenAI-compatible completions server) over a tiny random Llama. Nothing is downloaded."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("verifiers")
pytest.importorskip("torch")

from capo_envs.integrations.verifiers import load_environment  # noqa: E402

VF_EVAL = Path(sys.executable).parent / "vf-eval"


def test_rows_are_tasks_and_replies_are_stepped():
    env = load_environment("capo/SynthChain-v0", {"k": 2}, num_train_examples=2, num_eval_examples=3)
    rows = env.get_eval_dataset()
    assert len(rows) == 3 and rows[0]["info"]["task_id"] == "synthchain-0-dev-0"
    assert rows[0]["prompt"][0]["role"] == "system" and "<go>door</go>" in rows[0]["prompt"][0]["content"]
    assert rows[0]["prompt"][1]["content"].startswith("Step 1/2")
    assert env.sampling_args["stop"] == ["</go>"]

    async def play(replies):
        state = {"trajectory_id": "t", "info": rows[0]["info"]}
        await env.setup_state(state)
        answers = []
        for reply in replies:  # a reply cut at its stop string (the API's default) is completed
            answers.append(await env.env_response([{"role": "assistant", "content": reply}], state))
        await env.close_capo_env(state)
        return state, answers

    state, answers = asyncio.run(play(["<go>right", "no tags at all"]))
    assert state["capo"]["steps"] == 2 and state["capo"]["invalid_actions"] == 1
    assert state["capo"]["terminated"] and state["final_env_response"] == answers[-1]
    assert answers[1][0]["content"].startswith("Invalid action")
    with pytest.raises(ValueError, match="cannot make env"):
        load_environment("capo/NoSuchEnv-v0")


@pytest.fixture()
def served_tiny_model(tmp_path):
    """``capo serve`` itself, in its own process, over a saved tiny random Llama on a free port: its URL."""
    from capo_train.models import ActorCritic, make_tiny_llama, save_checkpoint

    model, tokenizer = make_tiny_llama(hidden_size=32, num_layers=2, seed=3)
    save_checkpoint(tmp_path / "run" / "checkpoint", ActorCritic(model, meta={"lora": None, "critic": None}), tokenizer)
    command = [sys.executable, "-c", "import sys; from capo_train.cli import main; sys.exit(main())", "serve",
               "--checkpoint", str(tmp_path / "run"), "--port", "0", "--device", "cpu",
               "--served-model-name", "tiny", "--max-model-len", "4096"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        banner = server.stdout.readline()  # "serving 'tiny' at http://127.0.0.1:PORT/v1 (...)"
        match = re.search(r"(http://127\.0\.0\.1:\d+/v1)", banner)
        assert match, f"capo serve printed {banner!r}"
        yield match.group(1)
    finally:
        # On a loaded machine the server can take over 30 s to exit even on SIGTERM (seen at load 5 on
        # 2 cores): kill it then, rather than leave it running after the test errors.
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.mark.slow
@pytest.mark.skipif(not VF_EVAL.exists(), reason="verifiers' vf-eval is not installed beside this Python")
def test_vf_eval_plays_a_capo_env_against_capo_serve(served_tiny_model, tmp_path):
    """``vf-eval capo_envs.integrations.verifiers`` finds load_environment by module name, plays 3 SynthChain
    tasks x 2 rollouts through the completions API, and saves the env's own rewards and metrics."""
    started = time.time()
    env_args = {"env": "capo/SynthChain-v0", "env_kwargs": {"k": 2}, "num_eval_examples": 3}
    command = [str(VF_EVAL), "capo_envs.integrations.verifiers", "-a", json.dumps(env_args), "-m", "tiny",
               "-b", served_tiny_model, "-k", "CAPO_TEST_KEY", "--api-client-type", "openai_completions",
               "-n", "3", "-r", "2", "-t", "24", "-c", "2", "-s", "-o", str(tmp_path / "out"), "--disable-tui"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "CAPO_TEST_KEY": "none", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    saved = sorted((tmp_path / "out").rglob("results.jsonl"))
    assert saved, sorted(str(p) for p in (tmp_path / "out").rglob("*"))
    results = [json.loads(line) for line in saved[0].read_text().splitlines() if line.strip()]
    assert len(results) == 6
    for result in results:
        metrics = result["metrics"]
        # each rollout played SynthChain to its end, which the env signalled: 2 decisions (an invalid reply,
        # all a random model writes, uses a decision up), and its reward is the env's return
        assert metrics["env_steps"] == 2 and metrics["terminated"] == 1.0, result
        assert result["stop_condition"] == "has_final_env_response" and result["error"] is None, result
        assert result["reward"] == metrics["episode_return"] and 0.0 <= result["reward"] <= 1.0
        assert metrics["invalid_actions"] <= 2 and "success" in metrics
        assert result["completion"][-1]["role"] == "user"  # the env's last observation closes the rollout
    print(json.dumps({"rewards": [r["reward"] for r in results], "seconds": round(time.time() - started, 1)}))
