"""What the domain recipes (configs/*.yaml) rest on: an env's ``random_action`` (a legal action, in its action
format), the erring demonstrator ``sft.expert_skill``, the tiny LM fitted to an env's text (``model.path:
tiny``), and the recipe files themselves loading as configs."""

from __future__ import annotations

import random
from pathlib import Path

import gymnasium as gym
import pytest

import capo_envs  # noqa: F401
from capo_train.config import ConfigError, load_config
from markers import needs_alfworld, needs_smollm2, needs_webshop

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
SCHOLAR = {"size": "tiny", "max_abstract_chars": 0, "search_limit": 5, "shown_per_call": 5, "pool_view": 5}


def play_random(env, rng: random.Random, steps: int) -> list[dict]:
    """Up to ``steps`` steps of the env's random actions (the expert's where there is none); their infos."""
    infos = []
    for _ in range(steps):
        action = env.unwrapped.random_action(rng) or env.unwrapped.expert_action()
        _, _, terminated, truncated, info = env.step(action)
        infos.append(info)
        if terminated or truncated:
            break
    return infos


@needs_webshop
def test_synthshop_random_actions_are_clicks_the_env_accepts():
    env = gym.make("capo/SynthShop-v0", split="train")
    env.reset(seed=0)
    assert env.unwrapped.random_action(random.Random(0)) is None  # the search page: only free-text search
    env.step(env.unwrapped.expert_action())
    rng = random.Random(1)
    drawn = {env.unwrapped.random_action(rng) for _ in range(200)}
    clickables = {f"click[{c}]" for c in env.unwrapped._session.clickables()}
    assert {a.lower() for a in drawn} == clickables - {"click[search]"}  # every clickable, and nothing else
    assert any(a != a.lower() for a in drawn)  # product IDs as the page shows them
    infos = play_random(env, rng, 10)
    assert infos and all(info["action_valid"] for info in infos)


@needs_webshop
def test_synthshop_expert_clicks_the_product_id_as_shown_and_still_wins():
    env = gym.make("capo/SynthShop-v0", split="train")
    obs, _ = env.reset(seed=3)
    actions, done = [], False
    while not done:
        action = env.unwrapped.expert_action()
        actions.append(action)
        obs, _, terminated, truncated, info = env.step(action)
        done = terminated or truncated
    product = env.unwrapped.goal["asin"]
    assert f"click[{product}]" in actions and product != product.lower()
    assert info["metrics"]["success"] == 1.0



def play_expert(env, seed: int) -> tuple[list[str], dict]:
    env.reset(seed=seed)
    actions, done, info = [], False, {}
    while not done:
        actions.append(env.unwrapped.expert_action())
        _, _, terminated, truncated, info = env.step(actions[-1])
        done = terminated or truncated
    return actions, info


@needs_webshop
def test_synthshop_first_hit_demonstrators_click_what_the_page_shows_first():
    """expert_mode="first" buys its search's first hit with the goal's options; "first-random-options" buys
    the same product with options drawn at random, the same for a task every time; the oracle's own product
    needs the goal's ASIN. Over 40 dev goals the three order as the options they read."""
    scores = {}
    for mode in ("goal", "first", "first-random-options"):
        env = gym.make("capo/SynthShop-v0", split="dev", max_steps=10, expert_mode=mode)
        runs = [play_expert(env, seed) for seed in range(40)]
        scores[mode] = sum(info["metrics"]["score"] for _, info in runs) / len(runs)
        if mode != "goal":
            actions, info = play_expert(env, 0)
            assert actions == runs[0][0]  # the same clicks for the same task, random options included
            assert actions[1] == f"click[{env.unwrapped._session._results[0]}]"  # the first hit, as shown
            assert actions[-1] == "click[buy now]" and info["metrics"]["purchased"] == 1.0
    assert scores["goal"] == 1.0
    assert scores["goal"] > scores["first"] > scores["first-random-options"] + 0.05
    with pytest.raises(ValueError, match="expert_mode"):
        gym.make("capo/SynthShop-v0", expert_mode="psychic")

@needs_webshop
def test_synthshop_buy_early_demonstrator_errs_only_by_skipping_the_options():
    """mistake="buy-early": random_action buys now on the product page while an option the expert would click
    is unchosen, and is None everywhere else, so a demonstrator that always errs buys the first hit with no
    options and one that never errs is expert_mode="first"."""
    kwargs = {"split": "dev", "max_steps": 10, "expert_mode": "first"}
    careful = gym.make("capo/SynthShop-v0", **kwargs)
    early = gym.make("capo/SynthShop-v0", mistake="buy-early", **kwargs)
    rng, scores, with_options = random.Random(0), {"careful": [], "early": []}, 0
    for seed in range(40):
        expert_actions, careful_info = play_expert(careful, seed)
        early.reset(seed=seed)
        actions, done = [], False
        while not done:
            action = early.unwrapped.random_action(rng) or early.unwrapped.expert_action()
            actions.append(action)
            _, _, terminated, truncated, info = early.step(action)
            done = terminated or truncated
        assert actions[:2] == expert_actions[:2]  # the same search and the same first hit: no other mistake
        assert actions[-1] == "click[buy now]" and info["metrics"]["purchased"] == 1.0
        if len(expert_actions) > 3:  # the expert clicked options: the early buyer skipped them all
            with_options += 1
            assert len(actions) == 3
        else:
            assert actions == expert_actions
        scores["careful"].append(careful_info["metrics"]["score"])
        scores["early"].append(info["metrics"]["score"])
    assert with_options >= 10
    assert sum(scores["careful"]) > sum(scores["early"]) + 0.05 * 40
    early.reset(seed=0)
    assert early.unwrapped.random_action(rng) is None  # the search page: the expert's search stands
    with pytest.raises(ValueError, match="mistake"):
        gym.make("capo/SynthShop-v0", mistake="rude")


@needs_webshop
def test_synthshop_option_handles_name_the_values_and_set_the_same_options():
    """option_handles=True: the product page shows ``o1 black``, ``click[o1]`` (or ``click[o1 black]``) sets that
    value and the value alone is refused; the demonstrator clicks handles and buys exactly what it buys without them."""
    kwargs = {"split": "dev", "max_steps": 10, "expert_mode": "first"}
    plain = gym.make("capo/SynthShop-v0", **kwargs)
    handled = gym.make("capo/SynthShop-v0", option_handles=True, **kwargs)
    clicked_handles = 0
    for seed in range(20):
        _, plain_info = play_expert(plain, seed)
        handled.reset(seed=seed)
        done = False
        while not done:
            action = handled.unwrapped.expert_action()
            session = handled.unwrapped._session
            if session.state.page == "item" and action != "click[buy now]":
                assert action[6:-1] in [f"o{i}" for i in range(1, 40)]
                clicked_handles += 1
            _, _, terminated, truncated, info = handled.step(action)
            assert info["action_valid"]
            done = terminated or truncated
        assert info["metrics"] == plain_info["metrics"]
    assert clicked_handles >= 5
    handled.reset(seed=0)
    handled.step(handled.unwrapped.expert_action())
    obs, *_ = handled.step(handled.unwrapped.expert_action())  # the first hit's product page
    session = handled.unwrapped._session
    (first_group, first_values), *_ = session._product()["options"].items()
    assert f"[SEP] {first_group} [SEP] o1 {first_values[0]} [SEP]" in obs
    *_, info = handled.step(f"click[{first_values[0]}]")
    assert not info["action_valid"]
    *_, info = handled.step("click[O1]")  # the protocol lower-cases a click
    assert info["action_valid"] and session.state.options == {first_group: first_values[0]}
    *_, info = handled.step("click[o999]")
    assert not info["action_valid"]
    handle, group, value = session.option_entries()[-1]  # the whole segment as the page shows it names it too
    assert handle != "o1" and value != first_values[0]
    *_, info = handled.step(f"click[o1 {value}]")  # a handle with another entry's value names nothing
    assert not info["action_valid"]
    *_, info = handled.step(f"click[{handle}  {value.upper()}]")
    assert info["action_valid"] and session.state.options[group] == value
    with pytest.raises(ValueError, match="option_handles"):
        gym.make("capo/SynthShop-v0", option_handles="yes")


def test_synthshop_all_options_offers_every_value_and_changes_nothing_else():
    """all_options=True (a CPU preset): every product offers each value of its type's option groups; titles,
    attributes and prices are the default catalogue's, which all_options=False leaves as it was."""
    from capo_envs.webshop.world import TYPES, generate_catalog

    plain, plain_attrs = generate_catalog(seed=7, num_products=150)
    full, full_attrs = generate_catalog(seed=7, num_products=150, all_options=True)
    assert plain_attrs == full_attrs
    values_by_query = {kind.query: dict(kind.options) for kind in TYPES}
    assert any(p["name"] != q["name"] for p, q in zip(plain, plain[1:]))
    for before, after in zip(plain, full):
        assert {k: v for k, v in before.items() if k != "customization_options"} == \
            {k: v for k, v in after.items() if k != "customization_options"}
        assert before["name"] not in values_by_query[before["query"].lower()]  # a title, not an option group
        groups = {name.lower(): [v["value"] for v in values] for name, values in (after["customization_options"] or {}).items()}
        assert groups == {name: list(values) for name, values in values_by_query[after["query"].lower()].items()}
        for name, values in (before["customization_options"] or {}).items():
            assert set(v["value"] for v in values) <= set(groups[name.lower()])


@needs_webshop
def test_synthshop_all_options_lets_the_first_hit_take_the_goals_options():
    """With all_options the first hit of the goal's search offers the goal's options, so expert_mode="first"
    wins most dev goals (0.87 of 100 measured; 0.39 without), and a demonstrator that always buys early none."""
    kwargs = {"split": "dev", "max_steps": 6, "results_per_page": 3, "expert_mode": "first"}
    wins = {}
    for all_options in (False, True):
        env = gym.make("capo/SynthShop-v0", all_options=all_options, **kwargs)
        wins[all_options] = sum(play_expert(env, seed)[1]["metrics"]["success"] for seed in range(30))
    assert wins[True] >= 22 and wins[True] >= wins[False] + 8
    early = gym.make("capo/SynthShop-v0", all_options=True, mistake="buy-early", **kwargs)
    rng = random.Random(0)
    for seed in range(10):
        infos = [{}]
        early.reset(seed=seed)
        while not (infos[-1].get("terminated") or len(infos) > 6):
            action = early.unwrapped.random_action(rng) or early.unwrapped.expert_action()
            _, _, terminated, truncated, info = early.step(action)
            infos.append({**info, "terminated": terminated or truncated})
        assert infos[-1]["metrics"]["success"] == 0.0  # every goal asks for an option
    with pytest.raises(ValueError, match="all_options"):
        gym.make("capo/SynthShop-v0", all_options="yes")


def test_synthscholar_random_action_expands_papers_in_the_pool_view():
    env = gym.make("capo/SynthScholar-v0", split="train", **SCHOLAR)
    obs, _ = env.reset(seed=0)
    rng = random.Random(0)
    assert env.unwrapped.random_action(rng) is None  # nothing in the pool yet
    obs, *_ = env.step(env.unwrapped.expert_action())
    action = env.unwrapped.random_action(rng)
    assert action.startswith("<expand>") and action.count("<expand>") <= 5
    _, _, _, _, info = env.step(action)
    assert info["action_valid"] and set(info["action"]["name"].split("+")) == {"expand"}


@needs_alfworld
def test_synthhouse_random_action_is_a_tagged_admissible_command():
    env = gym.make("capo/SynthHouse-v0", split="train", size="tiny", max_steps=5)
    env.reset(seed=0)
    action = env.unwrapped.random_action(random.Random(0))
    assert action.startswith("<action>") and action[len("<action>"):-len("</action>")] in env.unwrapped.available_actions()
    _, _, _, _, info = env.step(action)
    assert info["action_valid"] and info["metrics" if "metrics" in info else "action"]
    env.close()


def test_qa_random_action_is_a_guess_from_the_passages_seen():
    """QA's actions are free text: before a search there is no random action (the expert searches), after
    one it answers a capitalised word or number of the passages seen, which ends the episode."""
    env = gym.make("capo/SynthHop-v0", split="train", size="tiny")
    env.reset(seed=0)
    rng = random.Random(0)
    assert env.unwrapped.random_action(rng) is None
    passages, *_ = env.step(env.unwrapped.expert_action())
    guesses = {env.unwrapped.random_action(rng) for _ in range(50)}
    words = {g.removeprefix("<answer>").removesuffix("</answer>") for g in guesses}
    assert len(words) > 3 and all(w in passages and (w[0].isupper() or w.isdigit()) for w in words)
    _, _, terminated, _, info = env.step(guesses.pop())
    assert terminated and info["action_valid"] and info["action"]["name"] == "answer"


def test_qa_typed_guess_answers_the_gold_answers_kind():
    """``guess="typed"``: a number when the gold answer is one, else a name (whole, "Troulir Prirwald"), so
    the demonstrator's mistake is a plausible wrong answer; an unknown mode is refused."""
    env = gym.make("capo/SynthHop-v0", split="train", size="small", guess="typed")
    rng = random.Random(0)
    kinds = set()
    for seed in range(40):
        env.reset(seed=seed)
        passages, *_ = env.step(env.unwrapped.expert_action())
        gold = env.unwrapped._task.answers[0]
        words = {env.unwrapped.random_action(rng).removeprefix("<answer>").removesuffix("</answer>") for _ in range(20)}
        assert all(w in passages for w in words)
        if gold.isdigit():
            assert all(w.isdigit() for w in words)
        else:
            assert not any(w.isdigit() for w in words) and all(w.split()[0] not in ("The", "It") for w in words)
        kinds.add(gold.isdigit())
    assert kinds == {True, False}  # both kinds of question were drawn
    with pytest.raises(ValueError, match="guess"):
        gym.make("capo/SynthHop-v0", split="train", size="tiny", guess="loud")


def test_qa_early_guess_errs_only_before_the_last_hop():
    """``guess="early"``: a typed guess while a supporting passage is unseen, none once all are (the expert
    acts), so the demonstrator never answers a wrong value after the last hop."""
    env = gym.make("capo/SynthHop-v0", split="train", size="small", k=1, question_kinds=["bridge-2"], guess="early")
    base, rng = env.unwrapped, random.Random(0)
    guessed_midway = 0
    for seed in range(20):
        env.reset(seed=seed)
        assert base.random_action(rng) is None  # nothing seen yet
        passages, *_ = env.step(base.expert_action())
        if not base.found_all_support():
            word = base.random_action(rng).removeprefix("<answer>").removesuffix("</answer>")
            assert word in passages
            guessed_midway += 1
        while not base.found_all_support():
            _, _, terminated, _, _ = env.step(base.expert_action())
            if terminated:
                break
        else:
            # every hop found: the expert acts, never a guess
            assert all(base.random_action(rng) is None for _ in range(10))
    assert guessed_midway > 10


@needs_webshop
def test_an_erring_demonstrator_errs_and_a_skilled_one_does_not():
    from capo_train.models.tiny import make_tiny_tokenizer
    from capo_train.sft import expert_trajectories

    env = gym.make("capo/SynthShop-v0", split="train")
    tokenizer = make_tiny_tokenizer()

    def actions(skill: float) -> list[str]:
        trajectories = expert_trajectories(env, tokenizer, episodes=12, seed=0, expert_skill=skill)
        return [tokenizer.decode(a.action_ids) for t in trajectories for a in t.actions]

    skilled, erring = actions(1.0), actions(0.3)
    assert skilled != erring
    # the expert never goes back from a results page it searched; a random clicker does
    assert sum(a in ("click[back to search]", "click[< prev]", "click[next >]", "click[description]") for a in erring) > 0
    assert all("description" not in a and "features" not in a for a in skilled)


def test_capo_demo_measures_the_erring_demonstrator_a_recipe_clones(capsys):
    """`capo demo --expert-skill P --quiet`: the demonstrator of sft.expert_skill=P, summarised in one line."""
    from capo_train.cli import main

    def success(skill: float) -> float:
        assert main(["demo", "--env", "capo/SynthChain-v0", "--episodes", "40", "--quiet",
                     "--expert-skill", str(skill)]) == 0
        line = capsys.readouterr().out.strip()
        assert "\n" not in line and "success over 40 episodes" in line
        return float(line.split("episodes: ")[1].split(",")[0])

    assert success(1.0) == 1.0
    assert success(0.0) < 0.5  # random doors: each of SynthChain's 4 decisions is a coin flip or worse
    assert main(["demo", "--expert-skill", "1.5", "--quiet"]) == 2


def test_expert_skill_is_checked_by_the_config():
    assert load_config(overrides=["sft.expert_skill=0.5"]).sft.expert_skill == 0.5
    with pytest.raises(ConfigError, match="sft.expert_skill"):
        load_config(overrides=["sft.expert_skill=1.5"])


@pytest.mark.parametrize("name", ["synthhop", "synthshop", "synthhouse", "synthscholar"])
def test_the_domain_recipes_load(name):
    config = load_config(CONFIGS / f"{name}.yaml")
    assert config.model.path.startswith("tiny") != config.model.lora  # a tiny LM is fully fine-tuned
    assert 0 <= config.sft.expert_skill < 1  # the warm start leaves RL something to learn
    assert config.eval_episodes >= 100
    assert config.out_dir == f"runs/capo-{name}"


@needs_smollm2
@pytest.mark.parametrize("name", ["synthhop", pytest.param("synthshop", marks=needs_webshop),
                                  pytest.param("synthhouse", marks=needs_alfworld), "synthscholar"])
def test_a_recipes_policy_can_write_every_action_its_demonstrator_takes(name):
    """Every action the recipe's demonstrator takes fits the recipe's ``rollout.max_action_tokens`` in its
    model's tokens: a longer one is cut before its closing tag when the clone plays it (SynthHouse's first
    runs had 16, and `<action>take spatula 1 from sinkbasin 1</action>` is 17 SmolLM2 tokens)."""
    from transformers import AutoTokenizer

    from capo_train.models.smollm2 import resolve_model_path
    from capo_train.setup import make_envs
    from capo_train.sft import actions_over_limit, expert_trajectories

    config = load_config(CONFIGS / f"{name}.yaml")
    assert config.model.path == "smollm2"
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(config.model.path))
    env = make_envs(config, "train", 1)[0]
    try:
        trajectories = expert_trajectories(env, tokenizer, episodes=8, state=config.rollout.state,
                                           window=config.rollout.window,
                                           earlier_actions=config.rollout.earlier_actions, seed=0,
                                           expert_skill=config.sft.expert_skill)
    finally:
        env.close()
    too_long, longest = actions_over_limit(trajectories, config.rollout.max_action_tokens)
    assert too_long == 0, f"{name}: the longest demonstrated action has {longest} tokens"
    assert longest >= 5  # the lengths were measured: a tagged action is at least 5 tokens


@pytest.mark.parametrize("name", ["synthhop", "synthscholar"])
def test_a_recipes_held_out_split_holds_its_evaluation(name):
    """The >= 100 held-out episodes are distinct tasks of the recipe's own preset and split."""
    config = load_config(CONFIGS / f"{name}.yaml")
    env = gym.make(config.env.id, split=config.env.eval_split, **config.env.kwargs)
    assert len(env.unwrapped.task_ids()) >= config.eval_episodes


def test_a_tiny_lm_fitted_to_an_env_is_built_once_and_reads_its_text(tmp_path):
    from transformers import AutoTokenizer

    from capo_train.models.env_lm import ensure_env_lm

    made = []

    def make_env():
        made.append(1)
        return gym.make("capo/SynthScholar-v0", split="train", **SCHOLAR)

    folder = ensure_env_lm("capo/SynthScholar-v0", SCHOLAR, make_env, preset="tiny", data_dir=tmp_path)
    assert ensure_env_lm("capo/SynthScholar-v0", SCHOLAR, make_env, preset="tiny", data_dir=tmp_path) == folder
    assert len(made) == 1 and (folder / "config.json").is_file() and folder.parent == tmp_path / "models"
    other = ensure_env_lm("capo/SynthScholar-v0", {**SCHOLAR, "pool_view": 4}, make_env, preset="tiny",
                          data_dir=tmp_path)
    assert other != folder  # other kwargs, other text: another model
    tokenizer = AutoTokenizer.from_pretrained(folder)
    env = make_env()
    _, info = env.reset(seed=0)
    for fixed in (info["protocol"]["instructions"], "<search>", "</search>", "<expand>"):
        assert len(tokenizer(fixed, add_special_tokens=False)["input_ids"]) == 1, fixed
    text = env.unwrapped.expert_action()
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text


@pytest.mark.parametrize("name", ["synthscholar", pytest.param("synthshop", marks=needs_webshop)])
def test_a_domains_table_grid_runs_the_recipe_for_every_algorithm(name):
    """docs/results/domains/<name>/grid.yaml is the algorithm table on configs/<name>.yaml: its capo cell is the
    recipe run (same env, model, warm start, budget and evaluation; with a shared warm start, the recipe's warm
    start run once for every algorithm), and every algorithm spends the same episodes an iteration."""
    from capo_train.compare import cell_config, check_grid, grid_envs, load_grid, warm_start_config
    from capo_train.config import batch_shape, to_dict

    grid = load_grid(CONFIGS.parent / f"docs/results/domains/{name}/grid.yaml")
    check_grid(grid)
    (env,) = grid_envs(grid)
    recipe = load_config(CONFIGS / f"{name}.yaml")
    cell = cell_config(grid, env, "capo", 0)
    recipe_dict, cell_dict = to_dict(recipe), to_dict(cell)
    if grid.shared_warm_start:
        warm = warm_start_config(grid, env, 0)
        assert cell.sft.from_run == warm.out_dir and warm.iterations == 0 and warm.sft == recipe.sft
        cell_dict["sft"]["from_run"] = ""
    for settings in (recipe_dict, cell_dict):  # where it is written, and the batch shape checked below
        settings.pop("out_dir")
        for key in ("group_size", "tasks_per_batch"):
            settings["rollout"].pop(key)
    assert cell_dict == recipe_dict
    assert batch_shape(cell) == batch_shape(recipe) == (16, 1)
    for algo in grid.algos:
        tasks, group = batch_shape(cell_config(grid, env, algo, 0))
        assert tasks * group == recipe.rollout.episodes_per_batch
