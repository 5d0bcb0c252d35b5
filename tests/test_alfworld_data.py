"""``capo data prepare alfworld`` against a local 127.0.0.1 server holding archives in the release's layout."""

from __future__ import annotations

import dataclasses
import io
import json
import urllib.parse
import zipfile
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import pytest

from capo_envs.alfworld.games import NoGamesError, find_games, resolve_task_types
from capo_envs.core.paths import is_prepared
from data_prep import alfworld
from data_prep.alfworld import ARCHIVES, GAMES
from data_prep.cli import data_main
from data_prep.manifest import read_manifest, verify_files
from fixtures_official import FileServer, sha256_bytes, zip_bytes

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
    return {ARCHIVES["json"].url: zip_bytes(json_zip), ARCHIVES["pddl"].url: zip_bytes(pddl_zip),
            GAMES["2.1.2"].url: zip_bytes(games_zip)}


@contextmanager
def pinned_to(server: FileServer):
    """The release archives' sha256/size pins replaced by those of the bytes ``server`` holds now (the
    real pins describe the real releases, which no test downloads)."""
    def repin(table):
        out = {}
        for key, remote in table.items():
            served = server.files.get(urllib.parse.urlsplit(remote.url).path)
            out[key] = remote if served is None else dataclasses.replace(
                remote, sha256=sha256_bytes(served.data), size=len(served.data))
        return out

    with mock.patch.dict(alfworld.ARCHIVES, repin(alfworld.ARCHIVES)), mock.patch.dict(alfworld.GAMES, repin(alfworld.GAMES)):
        yield


@pytest.fixture
def release():
    with FileServer() as server:
        for url, data in release_archives().items():
            server.add(urllib.parse.urlsplit(url).path, data)
        yield server


def prepare(tmp_path, server, *extra, pin: bool = True) -> int:
    """``capo data prepare alfworld`` from ``server``, its pins set to the served bytes unless not ``pin``."""
    argv = ["prepare", "alfworld", "--data-dir", str(tmp_path), "--mirror", server.url, "--quiet", *extra]
    if not pin:
        return data_main(argv)
    with pinned_to(server):
        return data_main(argv)


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
    assert "(train games 2, valid_seen games 1, valid_unseen games 0)" in capsys.readouterr().out
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
    path = urllib.parse.urlsplit(GAMES["2.1.2"].url).path
    release.files[path].drop_after = 50
    assert prepare(tmp_path, release) == 0
    assert release.ranges(path) and read_manifest(tmp_path / "alfworld")["splits"]["train"]["games"] == 2


def test_a_corrupt_archive_leaves_no_dataset(tmp_path, release, capsys):
    path = urllib.parse.urlsplit(ARCHIVES["json"].url).path
    data = bytearray(release.files[path].data)
    data[40] ^= 0xFF  # inside the first member's bytes: its CRC no longer matches
    release.files[path].data = bytes(data)
    assert prepare(tmp_path, release) == 1
    err = capsys.readouterr().err
    assert "json_2.1.1_json.zip" in err and "the archive is corrupt" in err
    assert not is_prepared("alfworld", tmp_path)


def test_archives_without_the_release_layout_are_refused(tmp_path, release, capsys):
    for remote in (ARCHIVES["json"], ARCHIVES["pddl"], GAMES["2.1.2"]):
        release.files[urllib.parse.urlsplit(remote.url).path].data = zip_bytes({"other/readme.txt": b"hi"})
    assert prepare(tmp_path, release) == 1
    assert "json_2.1.1" in capsys.readouterr().err and not is_prepared("alfworld", tmp_path)


def test_unknown_games_version_is_refused(tmp_path, release):
    with pytest.raises(SystemExit):
        prepare(tmp_path, release, "--games", "9.9")


def _bomb(size: int) -> bytes:
    """A zip in the release's layout whose one member is ``size`` zero bytes (ratio about 1000)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf, zf.open("json_2.1.1/train/x/traj_data.json", "w") as out:
        for _ in range(size >> 20):
            out.write(b"\0" * (1 << 20))
    return buffer.getvalue()


def test_a_zip_bomb_from_a_mirror_is_refused_and_leaves_nothing(tmp_path, release, capsys):
    """The finding: a 1 MB archive holding one 1 GiB member was extracted. Even pinned to the bomb's own
    sha256 (a mirror's pins are what a test sets), the extraction caps refuse it."""
    path = urllib.parse.urlsplit(ARCHIVES["json"].url).path
    release.files[path].data = _bomb(128 << 20)
    assert len(release.files[path].data) < 300_000
    assert prepare(tmp_path, release) == 1
    err = capsys.readouterr().err
    assert "compression ratio" in err and "json_2.1.1_json.zip" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not is_prepared("alfworld", tmp_path)
    leftovers = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in leftovers) < 2_000_000, leftovers  # no unpacked junk, nor the bomb
    assert not (tmp_path / "alfworld").exists() and not list(tmp_path.glob("alfworld.*"))


def test_the_release_archives_are_pinned_by_sha256(tmp_path, release, capsys):
    """Without the test's re-pinning, the fixture archives are not the real releases: refused by sha256."""
    for table in (ARCHIVES, GAMES):
        for remote in table.values():
            assert len(remote.sha256) == 64 and remote.size > 1_000_000 and remote.note
    assert prepare(tmp_path, release, pin=False) == 1
    err = capsys.readouterr().err
    assert "expected 72018818" in err or ARCHIVES["json"].sha256 in err  # the size is checked first
    assert not is_prepared("alfworld", tmp_path)


@pytest.mark.parametrize("fault", ["bomb", "corrupt", "unpinned", "server down"])
def test_a_failed_force_keeps_the_good_dataset(tmp_path, release, capsys, fault):
    """The finding: --force deleted the manifest before downloading, so a refused archive left the good
    dataset reading as not prepared. Now the rebuild happens beside it and replaces it only on success."""
    assert prepare(tmp_path, release) == 0
    before = read_manifest(tmp_path / "alfworld")
    path = urllib.parse.urlsplit(ARCHIVES["json"].url).path
    if fault == "bomb":
        release.files[path].data = _bomb(64 << 20)
    elif fault == "corrupt":
        data = bytearray(release.files[path].data)
        data[40] ^= 0xFF
        release.files[path].data = bytes(data)
    elif fault == "server down":
        del release.files[path]
    if fault == "unpinned":  # the mirror's bytes differ from the pins
        release.files[path].data = zip_bytes({"json_2.1.1/other.json": b"{}"})
        code = data_main(["prepare", "alfworld", "--data-dir", str(tmp_path), "--mirror", release.url, "--quiet", "--force"])
    else:
        code = prepare(tmp_path, release, "--force")
    assert code == 1
    assert "Traceback" not in capsys.readouterr().err
    assert is_prepared("alfworld", tmp_path) and read_manifest(tmp_path / "alfworld") == before
    assert data_main(["verify", "alfworld", "--data-dir", str(tmp_path)]) == 0
    assert find_games(tmp_path / "alfworld", "train")
    assert not list(tmp_path.glob("alfworld.*"))


def test_a_successful_force_replaces_the_dataset(tmp_path, release):
    assert prepare(tmp_path, release) == 0
    first = read_manifest(tmp_path / "alfworld")["prepared"]
    assert prepare(tmp_path, release, "--force") == 0
    manifest = read_manifest(tmp_path / "alfworld")
    assert verify_files(tmp_path / "alfworld", manifest) == [] and manifest["splits"]["train"]["games"] == 2
    assert first and not list(tmp_path.glob("alfworld.*"))


@pytest.mark.shared
def test_the_real_game_served_as_the_release_is_playable(tmp_path, monkeypatch):
    from capo_envs.alfworld.engine import engine_available

    if not SHARED_GAME.is_dir() or not engine_available():
        pytest.skip("needs ../shared/data/alfworld and the alfworld extra")
    import gymnasium as gym

    files = {p.relative_to(SHARED_GAME.parent).as_posix(): p.read_bytes() for p in SHARED_GAME.rglob("*") if p.is_file()}
    by_suffix = {
        ARCHIVES["json"].url: {k: v for k, v in files.items() if k.endswith("traj_data.json")},
        ARCHIVES["pddl"].url: {k: v for k, v in files.items() if k.endswith("initial_state.pddl")},
        GAMES["2.1.2"].url: {k: v for k, v in files.items() if k.endswith("game.tw-pddl")},
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
