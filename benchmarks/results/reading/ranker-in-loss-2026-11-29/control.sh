#!/bin/bash
# session 2026-11-29 (8): the same-code control for inloss.sh: the fifth round's dnc reader
# (article, joined, top-4, rank prior) without --task.ranker-in-loss, at the code of the
# in-loss runs (/tmp/s8rl), 800 steps, step-limited, two side by side (no speed reported)
set -u
cd /work/main && source .venv/bin/activate
export PYTHONPATH=/tmp/s8rl/src
DATA=/work/data/squad/partial/train-v1.1-first-articles.json
OUT=/work/runs/s8/art
mkdir -p $OUT
name=dnc-control-seed$1-800
relmem train squad --task.train-file $DATA --task.held-out-articles 0.2 --task.split-seed 0 \
  --task.document article --task.rank-prior --model dnc --seed $1 \
  --steps 800 --time-limit-min 150 --out-dir $OUT --run-name $name > $OUT/$name.train.log 2>&1
relmem eval $OUT/$name --checkpoint $OUT/$name/checkpoints/latest --document article \
  --json-out $OUT/$name.latest.eval.json > $OUT/$name.latest.eval.log 2>&1
echo "$(date +%T) $name done" >> /work/runs/s8/progress
