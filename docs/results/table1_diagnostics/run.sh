#!/usr/bin/env bash
# Regenerates one grid of docs/results/table1_diagnostics: a tiny Llama built from a config, behaviour-cloned
# on a diagnostic env from a demonstrator right half the time, then `capo compare` over every registered
# algorithm x 3 seeds. Resumable: rerun after a stop.
#   run.sh          SynthChain k = 1 and k = 4 (grid.yaml)    -> results.md, results.csv, curves.png here
#   run.sh k8       SynthChain k = 8 (grid_k8.yaml)           -> k8/
#   run.sh length   SynthLength (grid_length.yaml)            -> length/, and CAPO alone at two wider
#                   action clips (3e-3, 0.2)                  -> length/clip-3e-3/, length/clip-0.2/
set -euo pipefail
cd "$(dirname "$0")/../../.."
GRID_NAME=${1:-chain}
HERE=docs/results/table1_diagnostics
case "$GRID_NAME" in
  chain)  GRID=$HERE/grid.yaml;        DEST=$HERE;        WARM_ENV=capo/SynthChain-v0;  WARM_KWARGS="{k: 4, expert_skill: 0.5}"
          WARM_NAME=warm ;;
  k8)     GRID=$HERE/grid_k8.yaml;     DEST=$HERE/k8;     WARM_ENV=capo/SynthChain-v0;  WARM_KWARGS="{k: 8, expert_skill: 0.5}"
          WARM_NAME=warm-k8 ;;
  length) GRID=$HERE/grid_length.yaml; DEST=$HERE/length; WARM_ENV=capo/SynthLength-v0
          WARM_KWARGS="{long_words: 8, texts: recall, ask_by: number, expert_skill: 0.5}"
          WARM_NAME=warm-length; SFT_EPISODES=4096 ;;
  *) echo "usage: run.sh [chain|k8|length]" >&2; exit 2 ;;
esac
ROOT=${OUT:-runs/table1_diagnostics}
WARM=$ROOT/$WARM_NAME
TOKENS=$(grep -o 'max_action_tokens: [0-9]*' "$GRID" | grep -o '[0-9]*$')
JOBS=${JOBS:-2}
SFT_EPISODES=${SFT_EPISODES:-256}
export OMP_NUM_THREADS=1  # one thread per process: the parallel cells use the cores better than threads

[ -f "$ROOT/init/config.json" ] || .venv/bin/python -c "
from capo_train.models import make_tiny_llama
model, tokenizer = make_tiny_llama(hidden_size=64, num_layers=2, seed=0)
model.save_pretrained('$ROOT/init'); tokenizer.save_pretrained('$ROOT/init')"
[ -f "$WARM-start/summary.json" ] || .venv/bin/capo sft --env "$WARM_ENV" model.path="$ROOT/init" \
    model.lora=false "env.kwargs=$WARM_KWARGS" sft.episodes=$SFT_EPISODES sft.epochs=6 \
    optim.actor_lr=1e-3 rollout.max_action_tokens=$TOKENS eval_episodes=100 log_tensorboard=false \
    out_dir="$WARM-start"
[ -d "$WARM" ] || .venv/bin/capo export --checkpoint "$WARM-start" --out "$WARM"
.venv/bin/capo compare --grid "$GRID" --out "$ROOT/grid-$GRID_NAME" --jobs "$JOBS" base.model.path="$WARM"
mkdir -p "$DEST"
cp "$ROOT/grid-$GRID_NAME"/{results.md,results.csv,curves.png,grid.json} "$DEST/"
head -1 "$WARM-start/log.jsonl" > "$DEST/warm_start.json"
if [ "$GRID_NAME" = length ]; then  # does CAPO's 3e-4 action clip suit the length-calibrated ratio?
  for CLIP in 3e-3 0.2; do
    .venv/bin/capo compare --grid "$GRID" --out "$ROOT/grid-length-clip-$CLIP" --jobs "$JOBS" base.model.path="$WARM" \
        "algos=[capo]" base.algo_overrides.clip_low=$CLIP base.algo_overrides.clip_high=$CLIP
    mkdir -p "$DEST/clip-$CLIP"
    cp "$ROOT/grid-length-clip-$CLIP"/{results.md,results.csv,curves.png,grid.json} "$DEST/clip-$CLIP/"
  done
fi
