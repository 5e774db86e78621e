#!/usr/bin/env bash
# The README's language-modelling and Learning to Execute rows, one run at a time.
#
#   bash benchmarks/quiet_round.sh WIKITEXT2_DIR OUT [WORD_LANGUAGE_MODEL_DIR]
#
# For seeds 0 and 1 and the RMC and the LSTM: `relmem train lm` (the `cpu` preset, 10 minutes,
# one thread) on WIKITEXT2_DIR (train.txt, valid.txt, test.txt) and `relmem train lte` (the
# `cpu` preset: full programs, L=3, N=2, 10 minutes, one thread), each followed by `relmem eval`
# and `relmem plot`; the 1-minute load average is sampled every 15 s beside each run into
# OUT/TASK/load-RUN.log. Given a checkout of pytorch/examples' word_language_model folder, its
# main.py then runs one epoch with its defaults on the same files with one thread (its log:
# OUT/word_language_model.log). Nothing else should run meanwhile: the runs are timed.
# Then: python benchmarks/round_table.py keep OUT/lm/*/ --to ... --load-logs OUT/lm (see there).
set -euo pipefail
if [[ $# -lt 2 ]]; then
  sed -n '2,13p' "$0"
  exit 2
fi
data=$1 out=$2 example=${3:-}
relmem=${RELMEM:-relmem}
mkdir -p "$out/lm" "$out/lte"

sample_load() {  # the 1-minute, 5-minute and 15-minute load averages every 15 s
  while true; do
    echo "$(date -u +%H:%M:%S) $(cut -d' ' -f1-3 /proc/loadavg)"
    sleep 15
  done
}

timed() {  # LOG, then the command: run it with the load sampled into LOG
  local log=$1
  shift
  sample_load >"$log" &
  local sampler=$!
  local status=0
  "$@" || status=$?
  kill "$sampler"
  return "$status"
}

for seed in 0 1; do
  for model in rmc lstm; do
    run=$model-seed$seed
    timed "$out/lm/load-$run.log" "$relmem" train lm --data-dir "$data" --model "$model" \
      --seed "$seed" --out-dir "$out/lm" --run-name "$run"
    "$relmem" eval "$out/lm/$run"
    "$relmem" plot "$out/lm/$run"
  done
done
for seed in 0 1; do
  for model in rmc lstm; do
    run=$model-seed$seed
    timed "$out/lte/load-$run.log" "$relmem" train lte --model "$model" --seed "$seed" \
      --out-dir "$out/lte" --run-name "$run"
    "$relmem" eval "$out/lte/$run"
    "$relmem" plot "$out/lte/$run"
  done
done
if [[ -n $example ]]; then
  (cd "$example" && timed "$out/load-word_language_model.log" env OMP_NUM_THREADS=1 \
    python main.py --data "$data" --epochs 1 --save "$out/word_language_model.pt") \
    >"$out/word_language_model.log" 2>&1
fi
