#!/usr/bin/env bash
# Build .venv-verl: the separate virtual environment for capo_train.integrations.verl and its tests.
#   bash scripts/verl_venv.sh            # create or update .venv-verl (idempotent)
#   .venv-verl/bin/python -m pytest -q tests/test_verl_*.py
# verl 0.9.x needs its `verl-core` extra to import its trainer and pins transformers below 5.11, which the
# main .venv does not satisfy (docs/scaleout.md, "verl"): hence a venv of its own. Torch is installed first,
# pinned to the CPU build, so that verl's bare `torch` requirement cannot pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VERL_VENV:-.venv-verl}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip --disable-pip-version-check -q"
$PIP install --upgrade pip
"$VENV/bin/python" -c "import torch" 2>/dev/null || $PIP install "torch==2.13.0"
# capo-gym with its verl extra (verl[verl-core]>=0.9,<0.10) and pytest; torch stays the CPU build above.
$PIP install -e ".[verl]" "pytest>=8" "pytest-timeout>=2.3"
"$VENV/bin/python" - <<'PY'
import torch, verl, transformers
assert "+cpu" in torch.__version__ or not torch.version.cuda, f"CUDA torch was installed: {torch.__version__}"
print(f"verl {verl.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")
PY
