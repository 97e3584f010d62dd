#!/usr/bin/env bash
# CI's llama.cpp check (issue 58), run by .ci/run after tests/engines/vllm_check.sh has trained the quickstart's
# z-lab DFlash and EAGLE-3 ($VLLM_CHECK_WORK/<kind>/plan.json names each); the kinds vLLM's CPU build does not serve
# (DSpark and DFlash2, over the target's head) are trained here the same way, on the same hidden-state cache:
# 1. the pinned engine, built once into ~/.cache/pdraft-engines keyed by its version and this CPU's flags
#    (tests/engines/llamacpp_build.sh: a later run on this machine reuses it, a half build is redone);
# 2. `pdraft check-serving DRAFTER --engine llamacpp` on the quickstart recipe, for each: tiny-stdlib and the drafter
#    converted by llama.cpp's own converter, served by llama-server, held round for round to pdraft's loop and to
#    llama.cpp's own target alone (a divergence is audited: a near-tie below the engine's measured bound is
#    printed, anything else fails). Exits non-zero on any problem.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_WAIT_POLICY=PASSIVE HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
PDRAFT_PYTHON="${PDRAFT_PYTHON:-.venv/bin/python}"
WORK="${VLLM_CHECK_WORK:-out/vllm-check}"
start=$(date +%s)
PDRAFT_PYTHON="$PDRAFT_PYTHON" bash tests/engines/llamacpp_build.sh | tail -2
built=$(date +%s)
for kind in ${LLAMACPP_CHECK_KINDS:-dflash eagle3 dspark-target-vocab dflash2}; do
    if [ ! -f "$WORK/$kind/plan.json" ]; then
        echo "== pdraft: train the $kind drafter"
        "$PDRAFT_PYTHON" tests/engines/vllm_dflash_check.py prepare --work "$WORK/$kind" --kind "$kind" \
            --cache "$WORK/hidden"
    fi
    drafter=$("$PDRAFT_PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["drafter"])' \
        "$WORK/$kind/plan.json")
    echo "== llama.cpp serves the $kind drafter"
    "$PDRAFT_PYTHON" -m pdraft check-serving "$drafter" --engine llamacpp --recipe recipes/quickstart.yaml
done
echo "== llama.cpp engine check took $(( $(date +%s) - start ))s (build or cache $(( built - start ))s)"
