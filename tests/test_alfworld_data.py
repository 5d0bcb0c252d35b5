"""``capo data prepare alfworld`` against a local 127.0.0.1 server holding archives in the release's layout."""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path

import pytest

from capo_envs.alfworld.games import NoGamesError, find_games, resolve_task_types
from capo_envs.core.paths import is_prepared
from data_prep.alfworld import ARCHIVES, GAMES, prepare_main
from data_prep.manifest import read_manifest, verify_files
from fixtures_official import FileServer, zip_bytes

SHARED_GAME = Path(__file__).resolve().parents[2] / "shared" / "data" / "alfworld" / "json_2.1.1"
TRIALS = {  # split/<task folder>: (task_type, game or None)
    "train/pick_and_place_simple-Apple-None-Fridge-1": ("pick_and_place_simple", {"solvable": True}),
    "train/pick_heat_then_place_in_recep-Egg-None-Fridge-2": ("pick_heat_then_place_in_recep", {"solvable": True}),
    "train/pick_cool_then_place_in_recep-Egg-None-Fridge-3": ("pick_cool_then_place_in_recep", {"pddl_problem": ""}),
    "train/pick_and_place_with_movable_recep-Apple-Bowl-Fridge-4": ("pick_and_place_with_movable_recep", {"solvable": True}),
    "valid_seen/look_at_obj_in_light-Book-None-DeskLamp-301": ("look_at_obj_in_light", {"solvable": True}),
    "valid_unseen/pick_two_obj_and_place-Mug-None-Shelf-201": ("pick_two_obj_and_place", None),
}


def release_archives() -> dict[str, bytes]:
    """The three zips as the release lays them out: every path starts with json_2.1.1/."""
    json_zip, pddl_zip, games_zip = {}, {}, {}
    for folder, (task_type, game) in TRIALS.items():
        trial = f"json_2.1.1/{folder}/trial_T20190001_000000_000001"
        json_zip[f"{trial}/traj_data.json"] = json.dumps({"task_type": task_type, "pddl_params": {}}).encode()
        pddl_zip[f"{trial}/initial_state.pddl"] = b"(define (problem p) (:domain alfred))"
        if game is not None:
            games_zip[f"{trial}/game.tw-pddl"] = json.dumps({"pddl_domain": "", "grammar": "", **game}).encode()
    return {ARCHIVES["json"]: zip_bytes(json_zip), ARCHIVES["pddl"]: zip_bytes(pddl_zip), GAMES["2.1.2"]: zip_bytes(games_zip)}


@pytest.fixture
def release():
    with FileServer() as server:
        for url, data in release_archives().items():
            server.add(urllib.parse.urlsplit(url).path, data)
        yield server


def prepare(tmp_path, server, *extra) -> int:
    return prepare_main(["--data-dir", str(tmp_path), "--mirror", server.url, "--quiet", *extra])


def test_prepare_builds_the_alfworld_data_layout_and_counts_games(tmp_path, release, capsys):
    assert prepare(tmp_path, release) == 0
    root = tmp_path / "alfworld"
    manifest = read_manifest(root)
    splits = manifest["splits"]
    assert {s: c["games"] for s, c in splits.items()} == {"train": 2, "valid_seen": 1, "valid_unseen": 0}
    assert splits["train"]["skipped"] == {"movable or sliced": 1, "no 'solvable' key": 1}
    assert splits["valid_unseen"]["skipped"] == {"no game.tw-pddl": 1}
    assert splits["train"]["by_task_type"] == {"pick_and_place_simple": 1, "pick_heat_then_place_in_recep": 1}
    trial = root / "json_2.1.1/train/pick_and_place_simple-Apple-None-Fridge-1/trial_T20190001_000000_000001"
    assert {p.name for p in trial.iterdir()} == {"traj_data.json", "initial_state.pddl", "game.tw-pddl"}
    assert sorted(manifest["files"]) == ["raw/json_2.1.1_json.zip", "raw/json_2.1.1_pddl.zip", "raw/json_2.1.2_tw-pddl.zip"]
    assert verify_files(root, manifest) == []
    assert is_prepared("alfworld", tmp_path)
    assert "train 2, valid_seen 1, valid_unseen 0" in capsys.readouterr().out
    # The index of playable games: the env reads it instead of opening every traj_data.json.
    for path in root.rglob("traj_data.json"):
        path.unlink()
    games = find_games(root, "train", resolve_task_types([4]))
    assert [(g.task_id, g.path.is_file()) for g in games] == [
        ("pick_heat_then_place_in_recep-Egg-None-Fridge-2/trial_T20190001_000000_000001", True)
    ]
    with pytest.raises(NoGamesError):
        find_games(root, "valid_unseen")
    # A second run is a no-op (nothing downloaded again).


def test_a_second_run_is_a_no_op(tmp_path, release):
    assert prepare(tmp_path, release) == 0
    requests = len(release.requests)
    assert prepare(tmp_path, release) == 0 and len(release.requests) == requests


def test_a_dropped_connection_resumes(tmp_path, release):
    path = urllib.parse.urlsplit(GAMES["2.1.2"]).path
    release.files[path].drop_after = 50
    assert prepare(tmp_path, release) == 0
    assert release.ranges(path) and read_manifest(tmp_path / "alfworld")["splits"]["train"]["games"] == 2


def test_a_corrupt_archive_leaves_no_dataset(tmp_path, release, capsys):
    path = urllib.parse.urlsplit(ARCHIVES["json"]).path
    data = bytearray(release.files[path].data)
    data[40] ^= 0xFF  # inside the first member's bytes: its CRC no longer matches
    release.files[path].data = bytes(data)
    assert prepare(tmp_path, release) == 1
    assert "fails its CRC check" in capsys.readouterr().err
    assert not is_prepared("alfworld", tmp_path)


def test_archives_without_the_release_layout_are_refused(tmp_path, release, capsys):
    for url in (ARCHIVES["json"], ARCHIVES["pddl"], GAMES["2.1.2"]):
        release.files[urllib.parse.urlsplit(url).path].data = zip_bytes({"other/readme.txt": b"hi"})
    assert prepare(tmp_path, release) == 1
    assert "json_2.1.1" in capsys.readouterr().err and not is_prepared("alfworld", tmp_path)


def test_unknown_games_version_is_refused(tmp_path, release):
    with pytest.raises(SystemExit):
        prepare(tmp_path, release, "--games", "9.9")


@pytest.mark.shared
def test_the_real_game_served_as_the_release_is_playable(tmp_path, monkeypatch):
    from capo_envs.alfworld.engine import engine_available

    if not SHARED_GAME.is_dir() or not engine_available():
        pytest.skip("needs ../shared/data/alfworld and the alfworld extra")
    import gymnasium as gym

    files = {p.relative_to(SHARED_GAME.parent).as_posix(): p.read_bytes() for p in SHARED_GAME.rglob("*") if p.is_file()}
    by_suffix = {
        ARCHIVES["json"]: {k: v for k, v in files.items() if k.endswith("traj_data.json")},
        ARCHIVES["pddl"]: {k: v for k, v in files.items() if k.endswith("initial_state.pddl")},
        GAMES["2.1.2"]: {k: v for k, v in files.items() if k.endswith("game.tw-pddl")},
    }
    with FileServer() as server:
        for url, members in by_suffix.items():
            server.add(urllib.parse.urlsplit(url).path, zip_bytes(members))
        assert prepare(tmp_path, server) == 0
    monkeypatch.setenv("CAPO_DATA_DIR", str(tmp_path))
    env = gym.make("capo/ALFWorld-v0")
    env.reset(seed=0)
    done = False
    while not done:
        _, reward, terminated, truncated, _ = env.step(env.unwrapped.expert_action())
        done = terminated or truncated
    assert terminated and reward == 1.0
    assert (tmp_path / "alfworld" / "logic" / "alfred.pddl").is_file()
    env.close()
