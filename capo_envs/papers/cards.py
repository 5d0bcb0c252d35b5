"""The ids the papers domain registers: SynthScholar (generated world) and PaperSearch (PaSa's queries)."""

from __future__ import annotations

from ..core.paths import is_prepared
from ..core.registry import EnvCard

_ACTIONS = ("up to 5 of <search>query</search> | <expand>arXiv id</expand> per turn, or <stop></stop> "
            "(or Hermes <tool_call> with action_format='tool_call'; paper_handles='pool' names papers P1, P2, ...)")
_REWARD = ("reward='gold' (default): 1/|gold| per newly found gold paper; 'selector': per call the top-3 selector "
           "scores of new papers (the paper's); 'mix'; -0.5 per repeated query or bad expand")
_METRICS = "success (= recall_all), precision/recall/f1 at all, 100, 50, 25, pool_size, searches, expands"

CARDS: tuple[EnvCard, ...] = (
    EnvCard(
        id="capo/SynthScholar-v0",
        entry_point="capo_envs.papers.synth:SynthScholarEnv",
        cpu_preset={"size": "small", "max_abstract_chars": 0, "search_limit": 5, "shown_per_call": 5, "pool_view": 5},
        cpu_preset_why="titles only and 5 papers per call: observations ~3.5x shorter, and the oracle still "
                       "finds every gold paper (docs/envs/papers.md); turns of several calls need "
                       "rollout.max_action_tokens=128",
        summary="paper search (search + citation expand) over a generated scholarly world with a citation graph",
        data="none (generated from a seed in about a second; size=tiny|small|medium|large)",
        action_format=_ACTIONS,
        reward=_REWARD,
        metrics=_METRICS,
    ),
    EnvCard(
        id="capo/PaperSearch-v0",
        entry_point="capo_envs.papers.env:make_papersearch_env",
        summary="PaSa's AutoScholarQuery / RealScholarQuery over a local arXiv database with citation edges",
        data="arXiv metadata (CC0) + citation edges in SQLite, PaSa's queries",
        prepare="capo data prepare papers",
        data_ready=lambda: is_prepared("papers"),
        action_format=_ACTIONS,
        reward=_REWARD,
        metrics=_METRICS,
    ),
)
