#!/usr/bin/env bash
# Issue 17's GPU checks in one command, for a short loan of one GPU of this workplace (the `device` tool):
#   here, once:  bash scripts/device_wheels.sh         # gymnasium's wheels into .whl/
#   there:       bash scripts/device_check.sh           # device run with carry [".whl"]; results under $OUT
# 1. benchmarks/gpu_check.py at Qwen3-1.7B's shape (random weights, nothing downloaded): HF generation
#    tokens/s, one CAPO update's MFU and peak memory, the log-prob gap between generation and training;
# 2. the GPU tests of the generation backends and the trainer's rollout backend (the vLLM ones skip where
#    vLLM is absent, as on this workplace's image: its 336 MB wheel cannot be carried there; docs/vllm.md).
# GPU_CHECK_ARGS adds arguments to gpu_check.py (e.g. "--tiny --device cpu" to try this script on a CPU).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/capo-device-check}"
mkdir -p "$out"
python="${PYTHON:-python3}"
if compgen -G ".whl/*.whl" > /dev/null; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/capo-site \
    .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/capo-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
"$python" -c "import sys, torch, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__,
'transformers', transformers.__version__, 'cuda', torch.cuda.is_available(),
torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')" 2>&1 | tee "$out/env.txt"
status=0
# shellcheck disable=SC2086  # GPU_CHECK_ARGS is a list of arguments
"$python" benchmarks/gpu_check.py ${GPU_CHECK_ARGS:-} --json "$out/gpu_check.json" 2>&1 | tee "$out/gpu_check.log" \
  || status=1
"$python" -m pytest -q -p no:cacheprovider tests/test_backend_vllm.py tests/test_rollout_backend.py \
  tests/test_gpu_check.py 2>&1 | tee "$out/pytest.log" || status=1
echo "device_check: exit $status, results in $out"
exit $status
