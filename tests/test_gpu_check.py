"""benchmarks/gpu_check.py --tiny: the GPU check's steps (HF generation, the log-prob gap, one CAPO update with
critic and reference, FLOPs and memory) run end to end on a CPU, and report sane numbers."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_tiny_run_reports_every_figure(tmp_path, capsys):
    gpu_check = load_script()
    out = tmp_path / "summary.json"
    assert gpu_check.main(["--tiny", "--device", "cpu", "--json", str(out)]) == 0
    summary = json.loads(out.read_text())
    printed = capsys.readouterr().out
    for line in ("HF generation:", "log-prob gap", "CAPO update"):
        assert f"[gpu_check] {line}" in printed
    assert summary["device"] == "cpu" and summary["dtype"] == "float32"
    assert summary["hf_generated_tokens"] > 0 and summary["hf_tokens_per_s"] > 0
    # float32 on a CPU: the sampler's log-probs are the training pass's, up to rounding
    assert summary["logp_gap_max_abs"] < 1e-4 and abs(summary["ratio_mean"] - 1) < 1e-4
    assert summary["update_rows"] == 4 and summary["update_model_tflops"] > 0
    for key in ("actor_loss", "critic_loss", "kl_ref", "update_s", "peak_memory_gib"):
        assert math.isfinite(summary[key]), key
    assert summary["mfu"] is None and summary["vllm"] == "skipped (no GPU)"


def test_flop_count_matches_the_formula():
    """Qwen3-1.7B's shape: 1.72B parameters in matrices (tied head counted once), 1.41B in the critic's
    backbone; a forward pass is 2N per token plus attention."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3Model

    from capo_train.models.actor_critic import SeparateCritic

    gpu_check = load_script()
    config = Qwen3Config(**gpu_check.QWEN3_1_7B)
    with torch.device("meta"):  # shapes only: no memory, no time
        actor, critic = Qwen3ForCausalLM(config), SeparateCritic(Qwen3Model(config))
    assert round(gpu_check.matrix_params(actor) / 1e9, 2) == 1.72
    assert round(gpu_check.matrix_params(critic) / 1e9, 2) == 1.41
    n = gpu_check.matrix_params(actor)
    assert gpu_check.forward_flops(n, config, [100]) == 2 * n * 100 + 4 * 28 * 2048 * 100 * 100


def test_tiny_run_in_bfloat16_casts_the_value_head_too(tmp_path):
    # On an H200 the full-size run failed in its first update: the script casts the whole critic to bfloat16,
    # value head included, and the head multiplied float32 hidden states by bfloat16 weights.
    gpu_check = load_script()
    out = tmp_path / "summary.json"
    assert gpu_check.main(["--tiny", "--device", "cpu", "--dtype", "bfloat16", "--json", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert summary["dtype"] == "bfloat16"
    for key in ("actor_loss", "critic_loss"):
        assert math.isfinite(summary[key]), key
