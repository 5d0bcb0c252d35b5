#!/usr/bin/env bash
# Issue 17's GPU checks in one command, for a short loan of one GPU of this workplace (the `device` tool):
#   here, once:  bash scripts/device_wheels.sh         # gymnasium's wheels into .whl/
#   there:       bash scripts/device_check.sh           # device run with carry [".whl"]; results under $OUT
# 1. benchmarks/gpu_check.py at Qwen3-1.7B's shape (random weights, nothing downloaded): HF generation
#    tokens/s, one CAPO update's MFU and peak memory, the log-prob gap between generation and training;
# 2. the GPU tests of the generation backends and the trainer's rollout backend (the vLLM ones skip where
#    vLLM is absent, as on this workplace's image: its 336 MB wheel cannot be carried there; docs/vllm.md);
# 3. `capo train` end to end on the GPU: capo, ppo, grpo and gigpo with a tiny env LM on SynthChain, a resume,
#    bfloat16, then the SynthScholar recipe's settings at SmolLM2-135M's shape (random weights: its config and
#    tokenizer from .whl/smollm2-shape; the weights cannot be carried) to time an iteration there.
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
# 3. capo train on the GPU. Each run must exit 0, say it ran on cuda and leave a checkpoint.
capo=("$python" -m capo_train.cli train)
train() {  # train NAME ARGS...: one run into $runs/NAME, its log appended to $out/train.log
  local name=$1; shift
  local log="$runs/$name.log"
  timeout "${TRAIN_TIMEOUT:-240}" "${capo[@]}" --out "$runs/$name" "$@" > "$log" 2>&1
  local rc=$?
  grep -q "model on cuda" "$log" || { [ -n "${GPU_CHECK_ARGS:-}" ] || rc=97; }
  [ -f "$runs/$name/checkpoint/run_state.json" ] || rc=98
  { echo "=== train $name $*: exit $rc"; cat "$log"; } >> "$out/train.log"  # one file: a device call returns 8
  echo "train $name: exit $rc; $(grep -E 'iteration [0-9]+/|held-out success' "$log" | tail -2 | tr '\n' ' ')"
  [ "$rc" = 0 ] || { tail -20 "$log"; status=1; }
}
runs=/tmp/capo-device-runs; rm -rf "$runs"; mkdir -p "$runs"
tiny=(--env capo/SynthChain-v0 --model tiny:tiny:20 sft.episodes=8 eval_every=2 eval_episodes=8)
for algo in capo ppo grpo gigpo; do train "$algo" --algo "$algo" "${tiny[@]}" iterations=2; done
train capo-resumed --algo capo "${tiny[@]}" iterations=3  # a fresh run of 3, to compare with the resumed one
cp -r "$runs/capo" "$runs/capo-resume"
train capo-resume --resume --algo capo "${tiny[@]}" iterations=3
"$python" - "$runs" <<'PY' 2>&1 | tee -a "$out/train.log"
import json, sys
runs = sys.argv[1]
def last(name):
    rows = [json.loads(line) for line in open(f"{runs}/{name}/log.jsonl")]
    return {k: v for k, v in rows[-1].items() if k.startswith(("actor/", "critic/", "rollout/")) and isinstance(v, float)}
a, b = last("capo-resumed"), last("capo-resume")
print("resume: iteration 3:", len(a), "actor, critic and rollout figures; largest gap, fresh vs resumed:",
      max(abs(a[k] - b[k]) for k in a) if a else "none")
PY
train capo-bf16 --algo capo "${tiny[@]}" iterations=2 model.dtype=bfloat16
if [ -d .whl/smollm2-shape ]; then
  "$python" -c "import sys, torch, transformers
cfg = transformers.AutoConfig.from_pretrained(sys.argv[1]); torch.manual_seed(0)
transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(sys.argv[2])
transformers.AutoTokenizer.from_pretrained(sys.argv[1]).save_pretrained(sys.argv[2])" .whl/smollm2-shape /tmp/smollm2-random
  cp .whl/smollm2-shape/chat_template.jinja /tmp/smollm2-random/ 2>/dev/null
  TRAIN_TIMEOUT=200 train smollm2-shape-scholar --config configs/synthscholar.yaml --model /tmp/smollm2-random \
    sft.episodes=16 iterations=2 eval_every=2 eval_episodes=16
  grep -E "warm start done|iteration [0-9]+/|seconds_per_iteration|\| capo" "$runs/smollm2-shape-scholar.log"
fi
echo "device_check: exit $status, results in $out"
exit $status
