#!/usr/bin/env bash
# The offline vision-language demo: make pictures, a tokenizer and a tiny Gemma 3 with images from nothing, measure
# the model, fine-tune all of it (vision tower, projector, language model) with the same recipe and CLI a real user
# runs, and measure it again. CPU only, no downloads.
#
#   make demo-vision                          # sets up .venv first
#   bash demo/run_demo_vision.sh [VENV_BIN]   # VENV_BIN: the folder holding python and tune (default: .venv/bin)
#   DEMO_OUT=/tmp/demo bash demo/run_demo_vision.sh   # write everything there instead of demo_out_vision/
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${1:-.venv/bin}"
OUT="${DEMO_OUT:-demo_out_vision}"
START=$(date +%s)
# One thread per process: the model's operations are too small to gain from more, and on a busy machine two threads
# made training 30 times slower (each operation waits for the thread the scheduler has set aside).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

rm -rf "$OUT"
echo "== 1/4 making the pictures, tokenizer and base model ($OUT/assets)"
"$BIN/python" demo/make_demo_vision.py "$OUT/assets"

EVAL=(--tokenizer "$OUT/assets/tokenizer/tokenizer.model" --data "$OUT/assets/data/heldout.json")
echo "== 2/4 held-out accuracy of the base model (random weights; 1 in 6 is chance)"
"$BIN/python" demo/evaluate_vision.py "$OUT/assets/base_model" "${EVAL[@]}" --label before

echo "== 3/4 fine-tuning: tune run full_finetune_single_device --config demo/vision_full_single_device"
"$BIN/tune" run full_finetune_single_device --config demo/vision_full_single_device \
    assets_dir="$OUT/assets" output_dir="$OUT/run"

CKPT=$(ls -d "$OUT"/run/step_* | sort -t_ -k2 -n | tail -1)
echo "== 4/4 held-out accuracy of the fine-tuned model ($CKPT)"
"$BIN/python" demo/evaluate_vision.py "$CKPT" "${EVAL[@]}" --label after

echo "== vision demo finished in $(( $(date +%s) - START )) s"
