#!/usr/bin/env bash
# The offline RLHF demo: supervised fine-tuning, a reward model, then GRPO with that reward model as its reward, each
# stage a `tune run` of a shipped recipe, on the demo's generated list tasks (counting: "How many items are in the
# list?"). Unlike `make demo-rl`, GRPO never checks an answer: what it learns comes from preference pairs through the
# reward model. CPU only, no downloads.
#
#   make demo-rlhf                         # sets up .venv first
#   bash demo/run_demo_rlhf.sh [VENV_BIN]  # VENV_BIN: the folder holding python and tune (default: .venv/bin)
#   DEMO_OUT=/tmp/demo_rlhf bash demo/run_demo_rlhf.sh   # write everything there instead of demo_rlhf_out/
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${1:-.venv/bin}"
OUT="${DEMO_OUT:-demo_rlhf_out}"
SFT_STEPS="${SFT_STEPS:-120}"  # a short supervised run: the model gets some answers right, not most
START=$(date +%s)
TOKENIZER="$OUT/assets/tokenizer/tokenizer.model"
COUNT_TASK="How many items are in the list?"
latest() { ls -d "$1"/step_* | sort -t_ -k2 -n | tail -1; }
# the held-out exact match on the counting task, from demo/evaluate.py's report
count_accuracy() { grep -F "  $COUNT_TASK" "$1" | awk '{print $NF}'; }

rm -rf "$OUT"
mkdir -p "$OUT/reports"
echo "== 1/7 making the demo data, tokenizer and base model ($OUT/assets)"
"$BIN/python" demo/make_demo.py "$OUT/assets"
"$BIN/python" -c "
import json, sys
rows = json.load(open(sys.argv[1]))
json.dump([r for r in rows if r['input'].endswith(sys.argv[3])], open(sys.argv[2], 'w'))
" "$OUT/assets/data/train.json" "$OUT/assets/data/train_count.json" "$COUNT_TASK"

echo "== 2/7 a short supervised fine-tuning: $SFT_STEPS steps of full_finetune_single_device"
"$BIN/tune" run full_finetune_single_device --config demo/full_single_device \
    assets_dir="$OUT/assets" output_dir="$OUT/sft" epochs=1 max_steps_per_epoch="$SFT_STEPS"
SFT=$(latest "$OUT/sft")

echo "== 3/7 held-out exact match after supervised fine-tuning ($SFT)"
"$BIN/python" demo/evaluate.py "$SFT" --tokenizer "$TOKENIZER" --data "$OUT/assets/data/heldout.json" \
    --label before | tee "$OUT/reports/sft.txt"

echo "== 4/7 preference pairs: the right count against the supervised model's wrong answers and a wrong count"
"$BIN/python" demo/make_rlhf_pairs.py "$SFT" --assets "$OUT/assets"

echo "== 5/7 the reward model: tune run reward_model_single_device --config demo/reward_single_device"
"$BIN/tune" run reward_model_single_device --config demo/reward_single_device \
    assets_dir="$OUT/assets" output_dir="$OUT/reward" checkpointer.checkpoint_dir="$SFT"
REWARD=$(latest "$OUT/reward")
"$BIN/python" demo/evaluate_rlhf_reward.py "$REWARD" --tokenizer "$TOKENIZER" \
    --pairs "$OUT/assets/data/pairs_heldout.json" | tee "$OUT/reports/reward.txt"

echo "== 6/7 GRPO with the reward model: tune run grpo_full_finetune_single_device --config demo/grpo_rm_single_device"
"$BIN/tune" run grpo_full_finetune_single_device --config demo/grpo_rm_single_device \
    assets_dir="$OUT/assets" output_dir="$OUT/grpo" checkpointer.checkpoint_dir="$SFT" \
    reward_functions.0.checkpointer.checkpoint_dir="$REWARD"
GRPO=$(latest "$OUT/grpo")

echo "== 7/7 held-out exact match after GRPO ($GRPO)"
"$BIN/python" demo/evaluate.py "$GRPO" --tokenizer "$TOKENIZER" --data "$OUT/assets/data/heldout.json" \
    --label after | tee "$OUT/reports/grpo.txt"

PAIR_ACCURACY=$(grep -F "held-out pair accuracy" "$OUT/reports/reward.txt" | awk '{print $6}')
echo
echo "== RLHF demo summary (held-out counting prompts: \"$COUNT_TASK\")"
printf '%-24s %-36s %s\n' "stage" "held-out metric" "value"
printf '%-24s %-36s %s\n' "1. SFT ($SFT_STEPS steps)" "exact match (greedy)" "$(count_accuracy "$OUT/reports/sft.txt")"
printf '%-24s %-36s %s\n' "2. reward model" "pair accuracy (chosen > rejected)" "$PAIR_ACCURACY"
printf '%-24s %-36s %s\n' "3. GRPO (RM reward)" "exact match (greedy)" "$(count_accuracy "$OUT/reports/grpo.txt")"
echo "== RLHF demo finished in $(( $(date +%s) - START )) s"
