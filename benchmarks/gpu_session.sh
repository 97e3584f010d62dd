#!/usr/bin/env bash
# Everything pdraft checks and times on a lent GPU, in one call of the device tool (its time is 15 minutes a task,
# start included). Each stage has its own time limit and the script goes on past a failed stage, so one call
# always returns what it could measure; the summary (stage, exit code, seconds) is printed last.
#
#   stage       what it shows
#   env         the card, the image's torch, pdraft importable with the carried wheels
#   kernels     the tests marked gpu: the fused Triton loss and DSpark sequential-head kernels on the real device
#   round-8b    benchmarks/gpu_round.py on a Qwen3-8B-shaped target (random weights): target step, verify 1..17,
#               each family's drafter pass per gamma, under decode backends off / auto, then
#               round-8b-graphs: backend on (torch.compile with CUDA graphs), compile time apart
#   quickstart  the whole lifecycle on CUDA (export-hidden, train four families, calibrate, bench, decode) on the
#               embedded target with a short budget: bench's own greedy check compares every speculative run with
#               the target alone token for token on the GPU
#   round-4b    the same as round-8b on a Qwen3-4B shape, if time is left
#
# On the device machine (the device tool runs it from the repository root, $OUT set, the wheels in .whl carried:
# the image's transformers is older than pdraft's floor and it has no datasets or pydantic):
#   bash benchmarks/gpu_session.sh
# STAGES="env quickstart" runs those stages alone; QS_STEPS, QS_SAMPLES, QS_CALIBRATE, QS_PROMPTS size the quickstart and
# ROUND_BACKENDS the round-8b stage's backends, QS_COMPILE the quickstart's decode.compile (off: the eager static
# path; auto compiles a CUDA graph for every new (batch, width), minutes before calibration's first rounds).
# Dry run on a CPU (every stage but the kernels, tiny sizes): DRY=1 OUT=/tmp/gpu-dry bash benchmarks/gpu_session.sh
set -u
OUT="${OUT:-out/gpu-session}"
mkdir -p "$OUT"
LOG="$OUT/session.log"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
PY="${PY:-python3}"
if [ -d .whl ] && ls .whl/*.whl > /dev/null 2>&1 && [ -z "${DRY:-}" ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        >> "$LOG" 2>&1 || echo "wheel install failed (see session.log)"
    export PYTHONPATH="/tmp/site:$PWD"
else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
T0=$(date +%s)
DEADLINE="${DEADLINE:-560}"  # seconds for all stages: the device call itself is limited to 600
QS_DIR="${QS_DIR:-/tmp/pdraft-gpu-quickstart}"
rm -rf "$QS_DIR"

stage() {  # stage NAME LIMIT_S COMMAND...: run unless $STAGES leaves NAME out
    local name=$1 limit=$2 start rc
    shift 2
    case " ${STAGES:-env kernels round-8b round-8b-graphs quickstart round-4b} " in *" $name "*) ;; *) return 0 ;; esac
    start=$(date +%s)
    local left=$(( T0 + DEADLINE - start ))
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -lt 15 ]; then echo "$name skipped: the session's ${DEADLINE} s are spent" | tee -a "$SUMMARY"; return 0; fi
    echo "== $name (limit ${limit} s, $(( start - T0 )) s into the session)" | tee -a "$LOG"
    timeout --kill-after=10 "$limit" "$@" >> "$LOG" 2>&1
    rc=$?
    echo "$name rc=$rc $(( $(date +%s) - start )) s" | tee -a "$SUMMARY" "$LOG"
    return 0
}

if [ -n "${DRY:-}" ]; then
    DEV=(--device cpu --tiny)
    CONFIGS_8B=tiny CONFIGS_4B=tiny
    QS=(--set train.steps=4 --set data.max_samples=24 --set calibrate.num_prompts=8 --set bench.num_prompts=2
        --set bench.max_new_tokens=8 --set runtime.device=cpu)
else
    DEV=(--device cuda)
    QS=(--set train.steps="${QS_STEPS:-200}" --set data.max_samples="${QS_SAMPLES:-600}"
        --set calibrate.num_prompts="${QS_CALIBRATE:-40}" --set bench.num_prompts="${QS_PROMPTS:-6}" --set runtime.device=cuda
        --set decode.compile="${QS_COMPILE:-off}")  # auto on CUDA compiles CUDA graphs per (batch, width) first
fi

stage env 60 bash -c "nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv 2>&1 | head -3;
    $PY -c 'import torch, transformers, pdraft; print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda,
    torch.cuda.is_available() and torch.cuda.get_device_name(0), \"transformers\", transformers.__version__)'"
if ! grep -q "^env rc=0" "$SUMMARY"; then echo "pdraft does not import here: stopping (session.log)"; tail -n 30 "$LOG"; exit 1; fi
if [ -z "${DRY:-}" ]; then
    stage kernels 90 $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_loss.py tests/test_kernels_seq_head.py
fi
stage quickstart "${QS_LIMIT:-170}" $PY -m pdraft.cli.main quickstart recipes/quickstart.yaml --set output_dir="$QS_DIR/run" \
    --set data.cache_dir="$QS_DIR/cache" "${QS[@]}"
find "$QS_DIR/run" -name bench.json -exec cp {} "$OUT/quickstart_bench.json" \; 2>/dev/null
stage round-8b "${ROUND_LIMIT:-150}" $PY benchmarks/gpu_round.py "${DEV[@]}" --configs "${CONFIGS_8B:-qwen3-8b}" \
    --backends "${ROUND_BACKENDS:-off,auto}" ${ROUND_EXTRA:-} --out "$OUT/gpu_round_8b.json"
stage round-8b-graphs 120 $PY benchmarks/gpu_round.py "${DEV[@]}" --configs "${CONFIGS_8B:-qwen3-8b}" --skip-loss \
    --backends on --out "$OUT/gpu_round_8b_graphs.json"
stage round-4b 60 $PY benchmarks/gpu_round.py "${DEV[@]}" --configs "${CONFIGS_4B:-qwen3-4b}" --skip-loss \
    --backends off,auto --out "$OUT/gpu_round_4b.json"
echo "---- summary ($(( $(date +%s) - T0 )) s in all)"
cat "$SUMMARY"
