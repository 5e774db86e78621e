#!/bin/bash
# session 2026-11-29 (9): earlier runs' last weights read again with each ranker, at git b9630b6
# (PYTHONPATH=/tmp/pin9b/src); beside training runs (evaluation: no speed).
#   reeval.sh RUN_DIR LABEL RANKER [CHECKPOINT (latest)]
set -u
cd /work/main && source .venv/bin/activate
export PYTHONPATH=/tmp/pin9b/src
OUT=/work/runs/s9/reeval
mkdir -p $OUT
relmem eval $1 --checkpoint $1/checkpoints/${4:-latest} --document article --ranker $3 \
  --json-out $OUT/$2.$3.eval.json > $OUT/$2.$3.eval.log 2>&1
