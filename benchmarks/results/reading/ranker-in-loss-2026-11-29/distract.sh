#!/bin/bash
# session 2026-11-29 (8): training rows with as many paragraphs as evaluation reads
# (--task.max-context-tokens 700: the 4 best, where 400 left 3.04 a row), the control's dnc
# reader otherwise, 400 steps, step-limited, two side by side (no speed reported); compared
# with the control runs' step-400 checkpoints
set -u
cd /work/main && source .venv/bin/activate
export PYTHONPATH=/tmp/s8mc/src
DATA=/work/data/squad/partial/train-v1.1-first-articles.json
OUT=/work/runs/s8/art
name=dnc-ctx700-seed$1-400
relmem train squad --task.train-file $DATA --task.held-out-articles 0.2 --task.split-seed 0 \
  --task.document article --task.rank-prior --task.max-context-tokens 700 --model dnc --seed $1 \
  --steps 400 --time-limit-min 150 --out-dir $OUT --run-name $name > $OUT/$name.train.log 2>&1
relmem eval $OUT/$name --checkpoint $OUT/$name/checkpoints/latest --document article \
  --json-out $OUT/$name.latest.eval.json > $OUT/$name.latest.eval.log 2>&1
control=dnc-control-seed$1-800
relmem eval $OUT/$control --checkpoint $OUT/$control/checkpoints/step-00000400 --document article \
  --json-out $OUT/$control.step400.eval.json > $OUT/$control.step400.eval.log 2>&1
echo "$(date +%T) $name done" >> /work/runs/s8/progress
