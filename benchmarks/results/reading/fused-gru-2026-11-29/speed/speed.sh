#!/bin/bash
# session 2026-11-29 (8): quiet training speed of the cpu reader, before (cad63c9) and after the
# fused GRU and the halved windowed attention (HEAD, pinned in /tmp/s8new), dnc and none,
# paragraph level, seed 0 (the same batches), 200 steps, interleaved rounds, alone on the machine
set -u
cd /work/main && source .venv/bin/activate
DATA=/work/data/squad/partial/train-v1.1-first-articles.json
OUT=/work/runs/s8/speed
mkdir -p $OUT
go() {  # CODE MODEL NAME STEPS
  local code=$1 model=$2 name=$3 steps=$4
  echo "$(date +%T) start $name load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/load.log
  PYTHONPATH=/tmp/s8$code/src relmem train squad --task.train-file $DATA --task.held-out-articles 0.2 \
    --task.split-seed 0 --model $model --seed 0 --steps $steps --time-limit-min 60 --out-dir $OUT \
    --run-name $name > $OUT/$name.train.log 2>&1
  echo "$(date +%T) end $name load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/load.log
}
go old dnc warmup-old 2
go new dnc warmup-new 2
for r in 1 2; do
  for model in dnc none; do
    go old $model $model-old-r$r 200
    go new $model $model-new-r$r 200
  done
done
echo "$(date +%T) done" >> $OUT/load.log
