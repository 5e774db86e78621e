#!/bin/bash
# quiet: the reader's parts before (git 406d6f0, /tmp/pin9c) and after (HEAD, /tmp/pin9d) the
# attention's live windows, two alternating rounds, load average recorded before each
cd /work/main && source .venv/bin/activate
OUT=/work/runs/s9/bench
for round in 1 2; do
  for side in before:/tmp/pin9c after:/tmp/pin9d; do
    name=${side%%:*}; tree=${side#*:}
    uptime > $OUT/$name-$round.load
    PYTHONPATH=$tree/src python benchmarks/reader_parts.py \
      --file /work/data/squad/partial/train-v1.1-first-articles.json > $OUT/$name-$round.json
  done
done
