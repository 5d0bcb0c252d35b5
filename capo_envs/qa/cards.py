"""The ids the qa domain registers: SynthHop (generated) and the three public multi-hop QA benchmarks."""

from __future__ import annotations

from ..core.paths import is_prepared
from ..core.registry import EnvCard

_ACTIONS = "<search>query</search> | <answer>text</answer> (or Hermes <tool_call>)"
_REWARD = "1 if the normalised answer exactly matches the gold answer or an alias, else 0"
_METRICS = "em, f1, answered, searches, support_recall"


def _qa_card(env_id: str, dataset: str, title: str) -> EnvCard:
    return EnvCard(
        id=env_id,
        entry_point="capo_envs.qa.env:make_qa_env",
        kwargs={"dataset": dataset},
        summary=f"{title}: multi-hop QA by searching the de-duplicated union of its context paragraphs",
        data=f"{title} official files + corpus + BM25 index",
        prepare=f"capo data prepare {dataset}",
        data_ready=lambda: is_prepared(dataset),
        action_format=_ACTIONS,
        reward=_REWARD,
        metrics=_METRICS,
    )


SYNTHHOP = EnvCard(
    id="capo/SynthHop-v0",
    entry_point="capo_envs.qa.synth:SynthHopEnv",
    cpu_preset={"size": "small", "k": 1, "max_passage_chars": 400, "question_kinds": ["bridge-2"]},
    cpu_preset_why="one 400-character passage per search keeps states under ~450 tokens; two-hop bridge "
                   "questions only, so a warm-started 135M model sees reward",
    summary="multi-hop QA (2-4 hops, bridge and comparison) over a generated encyclopedia of fictional entities",
    data="none (generated from a seed in seconds)",
    action_format=_ACTIONS,
    reward=_REWARD,
    metrics=_METRICS,
)

PUBLIC: tuple[EnvCard, ...] = (
    _qa_card("capo/HotpotQA-v0", "hotpotqa", "HotpotQA"),
    _qa_card("capo/2WikiMultihopQA-v0", "2wiki", "2WikiMultihopQA"),
    _qa_card("capo/MuSiQue-v0", "musique", "MuSiQue"),
)

CARDS: tuple[EnvCard, ...] = (SYNTHHOP, *PUBLIC)
