"""The shape of capo_envs: every domain package holds the same files, and every registered id's entry point
imports (without the data or the optional extras it needs at construction)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import capo_envs

ROOT = Path(capo_envs.__file__).parent
STANDARD = ("__init__.py", "cards.py", "protocol.py", "env.py")
# the domains with a generated variant of a public benchmark: its env (synth.py) and its world's generator
WITH_SYNTH_VARIANT = ("qa", "alfworld", "webshop", "papers")
MAX_LINES = 500


def test_domains_are_the_packages_beside_core_and_retrieval():
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    assert packages == {"core", "retrieval", "integrations", *capo_envs.DOMAINS}


@pytest.mark.parametrize("domain", capo_envs.DOMAINS)
def test_each_domain_has_the_standard_files(domain):
    files = {p.name for p in (ROOT / domain).glob("*.py")}
    expected = STANDARD + (("synth.py", "world.py") if domain in WITH_SYNTH_VARIANT else ())
    assert set(expected) <= files, f"capo_envs/{domain} lacks {sorted(set(expected) - files)}"


@pytest.mark.parametrize("domain", capo_envs.DOMAINS)
def test_each_domain_registers_its_cards(domain):
    package = importlib.import_module(f"capo_envs.{domain}")
    cards = importlib.import_module(f"capo_envs.{domain}.cards").CARDS
    assert package.CARDS is cards and cards
    for card in cards:
        assert capo_envs.CATALOG[card.id] is card
        assert card.entry_point.startswith(f"capo_envs.{domain}.")
    assert sum(len(importlib.import_module(f"capo_envs.{d}").CARDS) for d in capo_envs.DOMAINS) == len(capo_envs.CATALOG)


@pytest.mark.parametrize("env_id", sorted(capo_envs.CATALOG))
def test_every_entry_point_imports(env_id):
    module, _, attr = capo_envs.CATALOG[env_id].entry_point.partition(":")
    assert callable(getattr(importlib.import_module(module), attr))


def test_importing_capo_envs_imports_no_env_module():
    """``import capo_envs`` reads only the cards: no env, engine or generator module (nor torch)."""
    code = (
        "import sys, capo_envs\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('capo_envs.') and m.count('.') == 2\n"
        "                and m.rpartition('.')[2] not in ('cards', 'engine') and not m.startswith('capo_envs.core.'))\n"
        "print(loaded, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[] False"


def test_no_product_file_is_over_500_lines():
    long = {}
    for path in ROOT.rglob("*.py"):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES:
            long[str(path.relative_to(ROOT))] = lines
    assert not long, long
