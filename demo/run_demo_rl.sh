#!/usr/bin/env bash
# The offline RL demo: make the demo's data, tokenizer and small model from nothing, teach the model the list tasks
# a little with supervised fine-tuning, measure it, improve it on the counting task with GRPO (reward: exact match
# with the answer) using the same recipe and CLI a real user runs, and measure it again (per task: GRPO trained on
# "How many items are in the list?" only). CPU only, no downloads.
#
#   make demo-rl                         # sets up .venv first
#   bash demo/run_demo_rl.sh [VENV_BIN]  # VENV_BIN: the folder holding python and tune (default: .venv/bin)
#   DEMO_OUT=/tmp/demo_rl bash demo/run_demo_rl.sh   # write everything there instead of demo_rl_out/
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${1:-.venv/bin}"
OUT="${DEMO_OUT:-demo_rl_out}"
SFT_STEPS="${SFT_STEPS:-120}"  # a short supervised run: the model gets some answers right, not most
START=$(date +%s)

rm -rf "$OUT"
echo "== 1/5 making the demo data, tokenizer and base model ($OUT/assets)"
"$BIN/python" demo/make_demo.py "$OUT/assets"
# GRPO trains on one task, the one the short supervised run leaves half right: counting the items of a list
"$BIN/python" -c "
import json, sys
rows = json.load(open(sys.argv[1]))
json.dump([r for r in rows if r['input'].endswith('How many items are in the list?')], open(sys.argv[2], 'w'))
" "$OUT/assets/data/train.json" "$OUT/assets/data/train_count.json"

echo "== 2/5 a short supervised fine-tuning: $SFT_STEPS steps of full_finetune_single_device"
"$BIN/tune" run full_finetune_single_device --config demo/full_single_device \
    assets_dir="$OUT/assets" output_dir="$OUT/sft" epochs=1 max_steps_per_epoch="$SFT_STEPS"
SFT=$(ls -d "$OUT"/sft/step_* | sort -t_ -k2 -n | tail -1)

echo "== 3/5 held-out exact match before GRPO ($SFT)"
"$BIN/python" demo/evaluate.py "$SFT" --tokenizer "$OUT/assets/tokenizer/tokenizer.model" \
    --data "$OUT/assets/data/heldout.json" --label before

echo "== 4/5 GRPO: tune run grpo_full_finetune_single_device --config demo/grpo_single_device"
"$BIN/tune" run grpo_full_finetune_single_device --config demo/grpo_single_device \
    assets_dir="$OUT/assets" output_dir="$OUT/grpo" checkpointer.checkpoint_dir="$SFT"
GRPO=$(ls -d "$OUT"/grpo/step_* | sort -t_ -k2 -n | tail -1)

echo "== 5/5 held-out exact match after GRPO ($GRPO)"
"$BIN/python" demo/evaluate.py "$GRPO" --tokenizer "$OUT/assets/tokenizer/tokenizer.model" \
    --data "$OUT/assets/data/heldout.json" --label after

echo "== RL demo finished in $(( $(date +%s) - START )) s"
