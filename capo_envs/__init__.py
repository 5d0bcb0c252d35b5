"""capo_envs: Gymnasium text environments with explicit action boundaries.

``import capo_envs`` registers every id; ``gymnasium.make("capo/SynthHop-v0")`` then builds one.
This package never imports torch or capo_train.
"""

from __future__ import annotations

from .core import CATALOG, EnvCard, TextEnv, is_prepared, register_card

__version__ = "0.1.0"

_QA_ACTIONS = "<search>query</search> | <answer>text</answer> (or Hermes <tool_call>)"
_QA_REWARD = "1 if the normalised answer exactly matches the gold answer or an alias, else 0"
_QA_METRICS = "em, f1, answered, searches, support_recall"


def _qa_card(env_id: str, dataset: str, title: str) -> EnvCard:
    return EnvCard(
        id=env_id,
        entry_point="capo_envs.qa.env:make_qa_env",
        kwargs={"dataset": dataset},
        summary=f"{title}: multi-hop QA by searching the de-duplicated union of its context paragraphs",
        data=f"{title} official files + corpus + BM25 index",
        prepare=f"capo data prepare {dataset}",
        data_ready=lambda: is_prepared(dataset),
        action_format=_QA_ACTIONS,
        reward=_QA_REWARD,
        metrics=_QA_METRICS,
    )


for _card in (
    EnvCard(
        id="capo/SynthHop-v0",
        entry_point="capo_envs.synth.env:SynthHopEnv",
        summary="multi-hop QA (2-4 hops, bridge and comparison) over a generated encyclopedia of fictional entities",
        data="none (generated from a seed in seconds)",
        action_format=_QA_ACTIONS,
        reward=_QA_REWARD,
        metrics=_QA_METRICS,
    ),
    _qa_card("capo/HotpotQA-v0", "hotpotqa", "HotpotQA"),
    _qa_card("capo/2WikiMultihopQA-v0", "2wiki", "2WikiMultihopQA"),
    _qa_card("capo/MuSiQue-v0", "musique", "MuSiQue"),
):
    register_card(_card)

__all__ = ["CATALOG", "EnvCard", "TextEnv", "__version__"]
