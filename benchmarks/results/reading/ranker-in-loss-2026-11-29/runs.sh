#!/bin/bash
# session 2026-11-29 (8), the seventh round: what ran, step-limited, two runs side by side (no
# speed reported), each pair at its own pinned checkout of main (PYTHONPATH): d31142f for the
# first two pairs, 4432993 for the last (the same training code).
#   runs.sh train dnc-inloss-seed{0,1}-800 S 800 --task.ranker-in-loss
#   runs.sh train dnc-control-seed{0,1}-800 S 800
#   runs.sh train dnc-ctx700-seed{0,1}-400 S 400 --task.max-context-tokens 700
#   runs.sh eval dnc-control-seed{0,1}-800 step-00000400 step400   (the control at step 400)
# (the in-loss runs were also evaluated on their best weights: the same step-800 weights)
set -u
cd /work/main && source .venv/bin/activate
DATA=/work/data/squad/partial/train-v1.1-first-articles.json
OUT=/work/runs/s8/art
evaluate() {  # NAME CHECKPOINT LABEL: official F1 of the rows, the windows and the paragraphs
  relmem eval $OUT/$1 --checkpoint $OUT/$1/checkpoints/$2 --document article \
    --json-out $OUT/$1.$3.eval.json > $OUT/$1.$3.eval.log 2>&1
}
if [ "$1" = train ]; then  # train NAME SEED STEPS [OPTIONS]
  name=$2 seed=$3 steps=$4
  shift 4
  relmem train squad --task.train-file $DATA --task.held-out-articles 0.2 --task.split-seed 0 \
    --task.document article --task.rank-prior --model dnc --seed $seed --steps $steps \
    --time-limit-min 150 --out-dir $OUT --run-name $name "$@" > $OUT/$name.train.log 2>&1
  evaluate $name latest latest
else  # eval NAME CHECKPOINT LABEL
  evaluate "$2" "$3" "$4"
fi
