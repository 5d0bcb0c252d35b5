#!/usr/bin/env bash
# Regenerates docs/results/table1_diagnostics/{results.md,results.csv,curves.png,grid.json}: a tiny Llama
# built from a config, behaviour-cloned on SynthChain (k=4) from a demonstrator right half the time, then
# `capo bench` over every registered algorithm x 3 seeds. Resumable: rerun after a stop.
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-runs/table1_diagnostics}
JOBS=${JOBS:-2}
HERE=docs/results/table1_diagnostics
export OMP_NUM_THREADS=1  # one thread per process: the parallel cells use the cores better than threads

[ -f "$OUT/init/config.json" ] || .venv/bin/python -c "
from capo_train.models import make_tiny_llama
model, tokenizer = make_tiny_llama(hidden_size=64, num_layers=2, seed=0)
model.save_pretrained('$OUT/init'); tokenizer.save_pretrained('$OUT/init')"
[ -f "$OUT/warm-start/summary.json" ] || .venv/bin/capo sft --env capo/SynthChain-v0 model.path="$OUT/init" \
    model.lora=false "env.kwargs={k: 4, expert_skill: 0.5}" sft.episodes=256 sft.epochs=6 \
    optim.actor_lr=1e-3 rollout.max_action_tokens=24 eval_episodes=100 log_tensorboard=false \
    out_dir="$OUT/warm-start"
[ -d "$OUT/warm" ] || .venv/bin/capo export --checkpoint "$OUT/warm-start" --out "$OUT/warm"
.venv/bin/capo bench --grid "$HERE/grid.yaml" --out "$OUT/grid" --jobs "$JOBS" base.model.path="$OUT/warm"
cp "$OUT/grid/results.md" "$OUT/grid/results.csv" "$OUT/grid/curves.png" "$OUT/grid/grid.json" "$HERE/"
head -1 "$OUT/warm-start/log.jsonl" > "$HERE/warm_start.json"
