#!/usr/bin/env bash
# The offline demo: make a dataset, a tokenizer and a small model from nothing, measure the model, fine-tune it with
# the same recipe and CLI a real user runs, measure it again, and generate with the result. CPU only, no downloads.
#
#   make demo                         # sets up .venv first
#   bash demo/run_demo.sh [VENV_BIN]  # VENV_BIN: the folder holding python and tune (default: .venv/bin)
#   DEMO_OUT=/tmp/demo bash demo/run_demo.sh   # write everything there instead of demo_out/
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${1:-.venv/bin}"
OUT="${DEMO_OUT:-demo_out}"
START=$(date +%s)

rm -rf "$OUT"
echo "== 1/5 making the demo data, tokenizer and base model ($OUT/assets)"
"$BIN/python" demo/make_demo.py "$OUT/assets"

echo "== 2/5 held-out exact match of the base model (random weights)"
"$BIN/python" demo/evaluate.py "$OUT/assets/base_model" --tokenizer "$OUT/assets/tokenizer/tokenizer.model" \
    --data "$OUT/assets/data/heldout.json" --label before

echo "== 3/5 fine-tuning: tune run full_finetune_single_device --config demo/full_single_device"
"$BIN/tune" run full_finetune_single_device --config demo/full_single_device \
    assets_dir="$OUT/assets" output_dir="$OUT/run"

CKPT=$(ls -d "$OUT"/run/step_* | sort -t_ -k2 -n | tail -1)
echo "== 4/5 held-out exact match of the fine-tuned model ($CKPT)"
"$BIN/python" demo/evaluate.py "$CKPT" --tokenizer "$OUT/assets/tokenizer/tokenizer.model" \
    --data "$OUT/assets/data/heldout.json" --label after

echo "== 5/5 generation: tune run generate --config demo/generation"
PROMPT=$("$BIN/python" -c "import json; print(json.load(open('$OUT/assets/data/heldout.json'))[0]['input'])")
"$BIN/tune" run generate --config demo/generation assets_dir="$OUT/assets" output_dir="$OUT/generation" \
    checkpointer.checkpoint_dir="$CKPT" prompt.user="$PROMPT"

echo "== demo finished in $(( $(date +%s) - START )) s"
