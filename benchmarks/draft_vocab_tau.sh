#!/usr/bin/env bash
# tau of a DFlash drafter on the quickstart (builtin:tiny-stdlib, a 4096-token vocabulary) with a draft vocabulary
# of 1024 and 2048 tokens and with the whole vocabulary (the target's LM head), at gamma 8 and 16: one hidden-state
# cache, three trainings of the quickstart's DFlash (the recipe's steps; only drafter.draft_vocab_size differs),
# one bench over the quickstart's prompt sets. Figures: docs/DRAFTERS.md, "Draft vocabulary".
#   OMP_NUM_THREADS=1 bash benchmarks/draft_vocab_tau.sh [OUT]      (default OUT: runs/draft-vocab)
set -euo pipefail
OUT=${1:-runs/draft-vocab}
RECIPE=recipes/quickstart.yaml
PDRAFT=${PDRAFT:-pdraft}
$PDRAFT export-hidden "$RECIPE" --set output_dir="$OUT"
for v in 1024 2048 null; do
  $PDRAFT train "$RECIPE" --set output_dir="$OUT" --set drafter.kind=dflash --set drafter.draft_vocab_size=$v \
    --set train.output_dir="$OUT/dflash-vd-$v"
done
$PDRAFT bench "$RECIPE" --set output_dir="$OUT" --gamma 8,16 --drafter "$OUT/dflash-vd-1024/final" \
  --drafter "$OUT/dflash-vd-2048/final" --drafter "$OUT/dflash-vd-null/final"
