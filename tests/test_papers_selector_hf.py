"""The Hugging Face selector on tiny random models saved as plain HF folders (needs torch: marked slow)."""

from __future__ import annotations

import pytest

from capo_envs.papers.db import Paper, PaperDB
from capo_envs.papers.env import PaperSearchEnv
from capo_envs.papers.selector import HFSelector, make_selector
from capo_envs.papers.world import PaperTask

pytestmark = pytest.mark.slow

PAPERS = [Paper(f"2001.{i:05d}", f"Paper {i} on sparse attention", f"Abstract {i} about sparse attention.", 2020,
                ("A. B",), "2020-01-01") for i in range(5)]


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from capo_train.models.tiny import make_tiny_llama

    causal_dir, cls_dir = tmp_path_factory.mktemp("causal"), tmp_path_factory.mktemp("seqcls")
    model, tokenizer = make_tiny_llama(hidden_size=16, num_layers=1, seed=0)
    model.save_pretrained(causal_dir)
    tokenizer.save_pretrained(causal_dir)
    config = LlamaConfig(**{**model.config.to_dict(), "num_labels": 2})
    torch.manual_seed(1)
    LlamaForSequenceClassification(config).save_pretrained(cls_dir)
    tokenizer.save_pretrained(cls_dir)
    return causal_dir, cls_dir


def test_yes_no_judge_scores_are_probabilities(tiny_dirs):
    causal_dir, _ = tiny_dirs
    # The byte-level tokenizer has one token per character: "T"/"F" stand in for "True"/"False".
    pair = HFSelector(str(causal_dir), kind="yes_no", yes_token="T", no_token="F", batch_size=2)
    scores = pair.score("sparse attention", PAPERS)
    assert len(scores) == 5 and all(0.0 <= s <= 1.0 for s in scores)
    assert pair.score("sparse attention", PAPERS[:2]) == scores[:2]  # cached, same order
    full = HFSelector(str(causal_dir), kind="yes_no", yes_token="T", no_token="F", full_vocab=True)
    assert all(f < p for f, p in zip(full.score("sparse attention", PAPERS), scores))  # P over the whole vocabulary
    with pytest.raises(ValueError, match="one token"):
        HFSelector(str(causal_dir), kind="yes_no", yes_token="True").score("q", PAPERS[:1])


def test_sequence_classifier_transforms(tiny_dirs):
    _, cls_dir = tiny_dirs
    last = make_selector({"model": str(cls_dir), "transform": "softmax_last"}).score("q", PAPERS)
    flipped = make_selector({"model": str(cls_dir), "transform": "one_minus_softmax_last"}).score("q", PAPERS)
    assert all(a + b == pytest.approx(1.0, abs=1e-5) for a, b in zip(last, flipped))


def test_env_runs_with_the_hf_selector(tiny_dirs):
    _, cls_dir = tiny_dirs
    task = PaperTask("q", "sparse attention", ("2001.00001",))
    env = PaperSearchEnv(PaperDB.from_records(PAPERS), [task], selector=f"hf:{cls_dir}", reward="selector",
                         min_score=0.0)
    env.reset(seed=0)
    _, reward, *_ = env.step("<search>sparse attention</search>")
    assert 0.0 < reward <= 3.0 and len(env._pool) == 5
    env.close()
