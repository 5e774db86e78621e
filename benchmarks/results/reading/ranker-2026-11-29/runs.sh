#!/bin/bash
# session 2026-11-29 (9): what ran, step-limited (no speed reported), at a pinned checkout of
# main (PYTHONPATH=/tmp/pin9/src, git c052eae).
#   runs.sh train dnc-control-seed2-800 dnc 2 800
#   runs.sh train none-control-seed2-1200 none 2 1200
set -u
cd /work/main && source .venv/bin/activate
export PYTHONPATH=/tmp/pin9/src
DATA=/work/data/squad/partial/train-v1.1-first-articles.json
OUT=/work/runs/s9/art
evaluate() {  # NAME CHECKPOINT LABEL: official F1 of the rows, the windows and the paragraphs
  relmem eval $OUT/$1 --checkpoint $OUT/$1/checkpoints/$2 --document article \
    --json-out $OUT/$1.$3.eval.json > $OUT/$1.$3.eval.log 2>&1
}
if [ "$1" = train ]; then  # train NAME MODEL SEED STEPS [OPTIONS]
  name=$2 model=$3 seed=$4 steps=$5
  shift 5
  relmem train squad --task.train-file $DATA --task.held-out-articles 0.2 --task.split-seed 0 \
    --task.document article --task.rank-prior --model $model --seed $seed --steps $steps \
    --time-limit-min 150 --out-dir $OUT --run-name $name "$@" > $OUT/$name.train.log 2>&1
  evaluate $name latest latest
else  # eval NAME CHECKPOINT LABEL
  evaluate "$2" "$3" "$4"
fi
