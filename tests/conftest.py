"""Fixtures shared by the trainer-side tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A 1-layer Llama with a byte-level tokenizer, saved as a normal HF folder (``model.path=...``)."""
    from capo_train.models import make_tiny_llama

    path = tmp_path_factory.mktemp("tiny-llama")
    model, tokenizer = make_tiny_llama(hidden_size=16, num_layers=1, seed=0)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
