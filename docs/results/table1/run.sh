#!/usr/bin/env bash
# Regenerates docs/results/table1/{results.md,results.csv,curves.png,grid.json,warm_start.json}:
# a tiny SynthHop LM built from scratch, one behaviour-cloned warm start, then `capo compare` over every
# registered algorithm x 3 seeds. About 1 h 15 min on 2 CPU cores (JOBS=2). Resumable: rerun after a stop.
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-runs/table1}
JOBS=${JOBS:-2}
HERE=docs/results/table1
export OMP_NUM_THREADS=1  # one thread per process: the parallel cells use the cores better than threads
ENV='{size: small, k: 1, max_passage_chars: 200, question_kinds: [bridge-2, comparison]}'

[ -f "$OUT/tiny-lm/config.json" ] || .venv/bin/python -m capo_train.models.tiny_lm --out "$OUT/tiny-lm"
[ -f "$OUT/warm-start/summary.json" ] || .venv/bin/capo sft model.path="$OUT/tiny-lm" model.lora=false \
    sft.episodes=3000 sft.tasks=500 sft.epochs=4 sft.minibatch_rows=8 sft.lr=3e-3 sft.warmup_frac=0.05 \
    sft.lr_schedule=cosine sft.length_buckets=true sft.state_loss_coef=1.0 "env.kwargs=$ENV" \
    eval_episodes=100 log_tensorboard=false out_dir="$OUT/warm-start"
.venv/bin/capo compare --grid "$HERE/grid.yaml" --out "$OUT/grid" --jobs "$JOBS" \
    base.model.path="$OUT/warm-start/checkpoint/actor"
cp "$OUT/grid/results.md" "$OUT/grid/results.csv" "$OUT/grid/curves.png" "$OUT/grid/grid.json" "$HERE/"
head -1 "$OUT/warm-start/log.jsonl" > "$HERE/warm_start.json"
