"""``ShopEnv``: WebShop as a capo TextEnv, over any shop (the real catalogue or SynthShop's generated one),
and ``make_webshop_env``, the entry point of ``capo/WebShop-v0`` (SynthShop's is in ``synth.py``).

One task = one goal (by its index in the shuffled goal list, the original's ``fixed_{i}`` session).
Buying ends the episode (``terminated``) with the original's reward (``reward="score"``) or the CAPO
authors' (``reward="capo"``: +10 on success, and an invalid action costs 0.1 unless ``invalid_penalty`` is
given; ``score_weight`` w adds w x the score to any purchase, so a failed purchase still beats none); 15 actions
without a purchase truncate it. Success = score 1 (WS baselines' ``r == 1``).

Prepared data (``capo data prepare webshop --size small|full``) lives in ``$CAPO_DATA_DIR/webshop`` (full,
1.18M products) or ``$CAPO_DATA_DIR/webshop-small`` (1,000): ``products.sqlite`` (products in
``load_products``' layout and their prices), ``goals_human.json`` / ``goals_synthetic.json`` (shuffled
with the original's seed 233), ``index/bm25/`` and ``manifest.json``, written last.

Splits index the shuffled goal list as the original does (session ``fixed_{i}`` = goal i): test = goals
[0, 500), dev = [500, 1500), train = the rest (WS baseline_models); task ids are ``webshop-<goals>-<i>``.
"""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..core.env import MAX_COUNT, Outcome, TextEnv, choice_knob, float_knob, int_knob
from ..core.paths import DataNotPreparedError, dataset_dir, is_prepared
from ..core.protocol import Action
from .engine import (
    BACK_TO_SEARCH, BUY_NOW, DONE, ITEM, NEXT_PAGE, PREV_PAGE, PRODUCT_WINDOW, RESULTS, SUB, Purchase, ShopSession,
)
from .nouns import get_tagger
from .products import SPLIT_RANGES, split_goals
from .protocol import TOOLS, WebShopProtocol
from .reward import FUZZY_THRESHOLD, score_purchase, token_set_ratio
from .shop import ProductSearch, ProductStore, SqliteStore

DEFAULT_MAX_STEPS = 15  # CAPO and verl-agent's budget (ReAct: 15 env calls)
REWARDS = ("score", "capo")
SIZES = {"small": "webshop-small", "full": "webshop"}  # the prepared sizes and their dataset folders
GOAL_KINDS = ("human", "synthetic")
CAPO_SUCCESS_REWARD, CAPO_INVALID_PENALTY = 10.0, 0.1
NO_OPTIONS = -1.0  # r_option in info when the goal has no options (the original's None)
# The demonstrators expert_action() can play (docs/envs/webshop.md). "goal": the oracle, which pages to the
# goal's own product (by its ASIN, which the page never names) and clicks the goal's options. "first": clicks
# the first result of its search, what a reader of the page can do, then the goal's options. "first-random-
# options": the same product, then one option value per group drawn at random (fixed per task): a
# demonstrator that never reads which options the instruction asks for.
EXPERT_MODES = ("goal", "first", "first-random-options")
# What random_action() plays, an erring demonstrator's mistake (a warm start's sft.expert_skill < 1): "click" any
# clickable of the page; "buy-early" buy now on a product page whose options the expert would still click, and
# nothing elsewhere (the expert acts): a demonstrator whose one mistake is buying before choosing the options.
MISTAKES = ("click", "buy-early")
MAX_PAGE_TURNS = 4  # the oracle pages at most this far (all of a 50-hit search at 10 a page), else searches the title


class ShopEnv(TextEnv):
    """Observations in the original's text mode; actions ``search[...]`` / ``click[...]``.

    ``goals``: the goals of this split in order (the original's dict layout); ``task_prefix`` names them.
    ``info["available_actions"]``: ``search[<keywords>]`` where the page has a search bar, then ``click[x]`` for
    every clickable. On the buying step ``info["reward_parts"]`` holds the reward's parts (floats).
    """

    def __init__(
        self,
        store: ProductStore,
        search: ProductSearch,
        goals: Sequence[Mapping],
        *,
        task_prefix: str,
        goal_offset: int = 0,
        max_steps: int = DEFAULT_MAX_STEPS,
        reward: str = "score",
        invalid_penalty: float | None = None,
        score_weight: float = 0.0,
        noun_tagger: str = "auto",
        action_format: str = "plain",
        max_context_chars: int | None = None,
        render_mode: str | None = None,
        expert_mode: str = "goal",
        results_per_page: int = PRODUCT_WINDOW,
        mistake: str = "click",
        option_handles: bool = False,
    ):
        if importlib.util.find_spec("thefuzz") is None:
            raise ImportError("WebShop's reward needs thefuzz: pip install 'capo-gym[webshop]'")
        choice_knob("reward", reward, REWARDS)
        choice_knob("expert_mode", expert_mode, EXPERT_MODES)
        choice_knob("mistake", mistake, MISTAKES)
        if not isinstance(option_handles, bool):
            raise ValueError(f"option_handles must be a bool, got {option_handles!r}")
        int_knob("results_per_page", results_per_page, 1, MAX_COUNT)
        float_knob("score_weight", score_weight, 0.0, 1e6)
        if score_weight and reward != "capo":
            raise ValueError("score_weight adds the score to reward='capo'; reward='score' is the score already")
        if invalid_penalty is None:
            invalid_penalty = CAPO_INVALID_PENALTY if reward == "capo" else 0.0
        protocol = WebShopProtocol(TOOLS, action_format=action_format)
        super().__init__(
            protocol, max_steps=max_steps, invalid_penalty=invalid_penalty, max_context_chars=max_context_chars,
            render_mode=render_mode,
        )  # fmt: skip
        protocol.illegal, protocol.page = self._why_not, self._page_text
        if not goals:
            raise ValueError("this split has no goals")
        self.store, self.search_engine, self.goals = store, search, list(goals)
        self.reward_kind, self.expert_mode, self.results_per_page = reward, expert_mode, results_per_page
        self.mistake, self.option_handles, self.score_weight = mistake, option_handles, float(score_weight)
        self.tagger = get_tagger(noun_tagger)
        self._ids = [f"{task_prefix}-{goal_offset + i}" for i in range(len(self.goals))]
        self._index = {task_id: i for i, task_id in enumerate(self._ids)}
        self._session: ShopSession | None = None
        self._goal: Mapping | None = None
        self._parts: dict[str, Any] | None = None

    # --- TextEnv ----------------------------------------------------------------------------------------
    def task_ids(self) -> Sequence[str]:
        return self._ids

    def _start(self, task_id: str) -> tuple[str, dict[str, Any]]:
        self._goal = self.goals[self._index[task_id]]
        self._session = ShopSession(self.store, self.search_engine, self._goal["instruction_text"], self._score,
                                    results_per_page=self.results_per_page, option_handles=self.option_handles)
        self._parts = None
        return self._session.observation(), {"instruction": self._goal["instruction_text"]}

    def _act(self, action: Action) -> Outcome:
        session = self._require_session()
        if action.name == "search":
            session.search(action.args["keywords"])
            return Outcome(session.observation(), info={"page": session.state.page})
        score = session.click(action.args["value"])
        if session.state.page != DONE:
            return Outcome(session.observation(), info={"page": session.state.page})
        if self.reward_kind == "score":
            reward = score
        else:
            reward = CAPO_SUCCESS_REWARD * (score == 1.0) + self.score_weight * score
        parts = {k: float(NO_OPTIONS if v is None else v) for k, v in (self._parts or {}).items()}
        return Outcome(session.observation(), reward=reward, terminated=True, info={"page": DONE, "reward_parts": parts})

    def _metrics(self) -> dict[str, float]:
        session, goal = self._require_session(), self._goal or {}
        parts = self._parts or {}
        bought = session.purchase
        return {
            "success": float(bought is not None and session.reward == 1.0),
            "score": session.reward if bought else 0.0,
            "purchased": float(bought is not None),
            "exact_product": float(bought is not None and bought.asin == goal.get("asin")),
            "r_type": float(parts.get("r_type", 0.0)),
            "r_att": float(parts.get("r_att", 0.0)),
            "r_price": float(parts.get("r_price", 0.0)),
        }

    def available_actions(self) -> list[str] | None:
        session = self._session
        if session is None:
            return None
        actions = ["search[<keywords>]"] if session.has_search_bar() else []
        return actions + [f"click[{c}]" for c in session.clickables() if c != "search"]

    def random_action(self, rng) -> str | None:
        """A random click among the page's clickables, in the action format (never a search: its keywords
        are free text); with ``mistake="buy-early"``, buy now where the expert would still click an option,
        else None (the expert's action stands)."""
        session = self._session
        if self._done or session is None:
            return None
        if self.mistake == "buy-early":
            state = session.state
            on_its_product = self._goal is not None and (self.expert_mode != "goal" or state.asin == self._goal["asin"])
            if state.page != ITEM or not on_its_product or not self._options_to_click(state.asin, state.options):
                return None
            return self.protocol.render(Action("click", {"value": BUY_NOW.lower()}))
        shown = {asin.lower(): asin for asin in session._results}  # product IDs as the page shows them
        values = [shown.get(c, c) for c in session.clickables() if c != "search"]
        return self.protocol.render(Action("click", {"value": rng.choice(values)})) if values else None

    def close(self) -> None:
        self.store.close()
        self.search_engine.close()
        super().close()

    # --- helpers ----------------------------------------------------------------------------------------
    def _require_session(self) -> ShopSession:
        if self._session is None:
            raise RuntimeError("call reset() first")
        return self._session

    def _why_not(self, action: Action) -> str | None:
        if self._session is None:
            return "call reset() first"
        arg = action.args.get("keywords", action.args.get("value", ""))
        return self._session.why_not(action.name, arg)

    def _page_text(self) -> str:
        return self._session.observation() if self._session is not None else ""

    def _score(self, purchase: Purchase) -> float:
        product = self.store.get(purchase.asin)
        assert product is not None and self._goal is not None
        self._parts = score_purchase(product, self._goal, purchase.price, purchase.options, tagger=self.tagger)
        return self._parts["total_reward"]

    @property
    def goal(self) -> Mapping | None:
        return self._goal

    # --- the oracle -------------------------------------------------------------------------------------
    def oracle_query(self) -> str:
        """The goal's key terms: its attributes and its product type (the scraped search query)."""
        goal = self._goal or {}
        return " ".join([*goal.get("attributes", []), goal.get("query", "")]).strip().lower()

    def expert_action(self) -> str | None:
        """Search the goal's key terms, open a product, click options, buy (``expert_mode`` says which).

        "goal" pages to the target product; if the target is not among the hits, it searches again with its
        title (it then ranks first). The "first" modes click the first hit on page 1."""
        if self._done or self._session is None or self._goal is None:
            return None
        session, goal = self._session, self._goal
        state, target = session.state, goal["asin"]
        render = self.protocol.render
        by_goal = self.expert_mode == "goal"
        if state.page == SUB:
            return render(Action("click", {"value": PREV_PAGE.lower()}))
        if state.page == ITEM and by_goal and state.asin != target:
            return render(Action("click", {"value": PREV_PAGE.lower()}))
        if state.page == ITEM:
            for group, value in self._options_to_click(state.asin, state.options):
                return render(Action("click", {"value": session.option_clickable(group, value)}))
            return render(Action("click", {"value": BUY_NOW.lower()}))
        if state.page == RESULTS and not by_goal and session._results:
            if state.page_num > 1:
                return render(Action("click", {"value": PREV_PAGE.lower()}))
            return render(Action("click", {"value": session._results[0]}))
        if state.page == RESULTS and target in session._results:
            rank = session._results.index(target)
            want_page = rank // self.results_per_page + 1
            if abs(want_page - state.page_num) > MAX_PAGE_TURNS:  # short pages: its title is nearer
                return render(Action("search", {"keywords": self._target_title()}))
            if want_page == state.page_num:
                return render(Action("click", {"value": target}))  # as the page shows it (the protocol lower-cases)
            return render(Action("click", {"value": (NEXT_PAGE if want_page > state.page_num else PREV_PAGE).lower()}))
        query = self.oracle_query()
        if state.page == RESULTS and " ".join(state.keywords) == query:  # the key terms missed the target
            query = self._target_title()
        if not query:
            return render(Action("click", {"value": BACK_TO_SEARCH.lower()}))
        return render(Action("search", {"keywords": query}))

    def _target_title(self) -> str:
        product = self.store.get(self._goal["asin"]) if self._goal else None
        return (product or {}).get("Title", "").lower() or self.oracle_query()

    def _options_to_click(self, asin: str, selected: Mapping[str, str]) -> list[tuple[str, str]]:
        """The ``(group, value)`` options of product ``asin`` still to click: those the goal asks for, or in
        ``expert_mode="first-random-options"`` one per group drawn at random (the same draw for a task every
        time, so that the demonstrations of a task agree)."""
        product = self.store.get(asin) or {}
        groups: Mapping[str, Sequence[str]] = product.get("options", {})
        if self.expert_mode == "first-random-options":
            return [(name, random.Random(f"{self._task_id}:{name}").choice(list(values)))
                    for name, values in groups.items() if values and name not in selected]
        wanted = self._goal["goal_options"]
        clicks = []
        if isinstance(wanted, Mapping):
            for name, value in wanted.items():
                if value in groups.get(name, ()) and selected.get(name) != value:
                    clicks.append((name, value))
            return clicks
        chosen = dict(selected)
        for option in wanted:
            best = _best_value(option, groups)
            if best is not None and chosen.get(best[0]) != best[1]:
                chosen[best[0]] = best[1]
                clicks.append(best)
        return clicks


def _best_value(option: str, groups: Mapping[str, Sequence[str]]) -> tuple[str, str] | None:
    """The (group, value) equal to a human goal's option string, else its best fuzzy match above 85."""
    for name, values in groups.items():
        if option in values:
            return name, option
    best, best_score = None, FUZZY_THRESHOLD
    for name, values in groups.items():
        for value in values:
            score = token_set_ratio(value, option)
            if score > best_score:
                best, best_score = (name, value), score
    return best


def prepared_dir(size: str, data_dir: str | Path | None = None) -> Path:
    choice_knob("size", size, sorted(SIZES))
    return (Path(data_dir).expanduser() / SIZES[size]) if data_dir else dataset_dir(SIZES[size])


def webshop_ready(size: str = "full") -> bool:
    return is_prepared(SIZES[size])


def make_webshop_env(
    size: str = "full", goals: str = "human", split: str = "test", data_dir: str | None = None,
    retriever: str = "bm25", **kwargs: Any,
) -> ShopEnv:  # fmt: skip
    """``capo/WebShop-v0``: the original's catalogue, goals, pages and reward."""
    choice_knob("goals", goals, GOAL_KINDS)
    root = prepared_dir(size, data_dir)
    if not (root / "manifest.json").is_file():
        raise DataNotPreparedError(
            f"WebShop ({size}) is not prepared (missing {root / 'manifest.json'}). "
            f"Run: capo data prepare webshop --size {size}"
        )
    goal_file = root / f"goals_{goals}.json"
    if not goal_file.is_file():
        raise DataNotPreparedError(f"{goal_file} is missing; re-run: capo data prepare webshop --size {size}")
    all_goals = json.loads(goal_file.read_text())
    start = SPLIT_RANGES.get(split, (0, None))[0]
    store = SqliteStore(root / "products.sqlite")
    search = ProductSearch.load(root / "index" / retriever, kind=retriever)
    return ShopEnv(store, search, split_goals(all_goals, split), task_prefix=f"webshop-{goals}", goal_offset=start, **kwargs)
