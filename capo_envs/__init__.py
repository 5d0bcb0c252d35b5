"""capo_envs: Gymnasium text environments with explicit action boundaries.

``import capo_envs`` registers every id; ``gymnasium.make("capo/SynthHop-v0")`` then builds one.
This package never imports torch or capo_train.
"""

from __future__ import annotations

from .alfworld import CARDS as _ALFWORLD_CARDS
from .core import CATALOG, EnvCard, TextEnv, is_prepared, register_card
from .papers import CARDS as _PAPERS_CARDS
from .webshop import CARDS as _WEBSHOP_CARDS

__version__ = "0.1.0"

_QA_ACTIONS = "<search>query</search> | <answer>text</answer> (or Hermes <tool_call>)"
_QA_REWARD = "1 if the normalised answer exactly matches the gold answer or an alias, else 0"
_QA_METRICS = "em, f1, answered, searches, support_recall"
_GENERATED = "none (generated from a seed in seconds)"


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
        data=_GENERATED,
        action_format=_QA_ACTIONS,
        reward=_QA_REWARD,
        metrics=_QA_METRICS,
    ),
    EnvCard(
        id="capo/SynthChain-v0",
        entry_point="capo_envs.diagnostics.envs:SynthChainEnv",
        summary="diagnostic: k door choices (k=1..16), each cued by its observation, rewarded only at the end",
        data=_GENERATED,
        action_format="<go>left</go> | <go>right</go> (choices=2..4 doors)",
        reward="at the last step: the fraction of right doors (reward='fraction') or 1 if all were right ('all')",
        metrics="success, correct_fraction",
    ),
    EnvCard(
        id="capo/SynthLength-v0",
        entry_point="capo_envs.diagnostics.envs:SynthLengthEnv",
        summary="diagnostic: a 3-token <pick> then a long <write> (long_words=1..64) of the picked record",
        data=_GENERATED,
        action_format="<pick>n</pick> then <write>text</write> (or Hermes <tool_call> for the pick)",
        reward="at the end: token F1 of the write against the right record (reward='f1'), or exact match",
        metrics="success, pick_correct, write_f1",
    ),
    EnvCard(
        id="capo/SynthTrap-v0",
        entry_point="capo_envs.diagnostics.envs:SynthTrapEnv",
        summary="diagnostic: report shown codes while a malformed 'ANSWER: n' shortcut tempts (temptation=0..1)",
        data=_GENERATED,
        action_format="<answer>n</answer>; the shortcut is an invalid action",
        reward="1/steps per code reported right in the valid format, minus invalid_penalty per invalid action",
        metrics="success, correct_fraction, invalid_rate, shortcut_rate",
    ),
    _qa_card("capo/HotpotQA-v0", "hotpotqa", "HotpotQA"),
    _qa_card("capo/2WikiMultihopQA-v0", "2wiki", "2WikiMultihopQA"),
    _qa_card("capo/MuSiQue-v0", "musique", "MuSiQue"),
    *_ALFWORLD_CARDS,
    *_WEBSHOP_CARDS,
    *_PAPERS_CARDS,
):
    register_card(_card)

__all__ = ["CATALOG", "EnvCard", "TextEnv", "__version__"]
