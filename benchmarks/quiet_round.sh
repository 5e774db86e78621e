#!/usr/bin/env bash
# The README's headline rows, one run at a time, with the load average sampled beside each.
#
#   bash benchmarks/quiet_round.sh OUT lm WIKITEXT2_DIR [WORD_LANGUAGE_MODEL_DIR]
#   bash benchmarks/quiet_round.sh OUT lte
#   bash benchmarks/quiet_round.sh OUT minipacman | boxworld
#   bash benchmarks/quiet_round.sh OUT memory
#   bash benchmarks/quiet_round.sh OUT nth-farthest
#
# lm: `relmem train lm` (the `cpu` preset, 10 minutes, one thread) on WIKITEXT2_DIR (train.txt,
# valid.txt, test.txt), seeds 0 and 1, the RMC and the LSTM; given a checkout of
# pytorch/examples' word_language_model folder, its main.py then runs one epoch with its
# defaults on the same files with one thread (its log: OUT/word_language_model.log).
# lte: `relmem train lte` (full programs, L=3, N=2, 10 minutes, one thread), the same four runs.
# minipacman, boxworld: `relmem train TASK` (600 PPO steps, the preset's threads), the RMC and
# the LSTM, seed 0 then seed 1. memory: `relmem train repeat-copy` (the DNC and the LSTM, seed 0),
# `relmem train copy` and `relmem train associative-recall` (the DNC, seeds 0 and 1; the LSTM,
# seed 0); TASKS="copy" (say) runs only those tasks. nth-farthest: `relmem train nth-farthest`
# (the RMC and the LSTM on the `cpu` preset, the DNC on `dnc-cpu`), seed 0.
# Each run is followed by `relmem eval` and `relmem plot`; the 1-minute load average is
# sampled every 15 s beside each run into OUT/TASK/load-RUN.log. Nothing else should run
# meanwhile: the runs are timed. MODELS="lstm" (say) runs only those models' runs of every
# family.
# Then: python benchmarks/round_table.py keep OUT/TASK/*/ --to ... --load-logs OUT/TASK
set -euo pipefail
if [[ $# -lt 2 ]]; then
  sed -n '2,24p' "$0"
  exit 2
fi
out=$1 family=$2
shift 2
relmem=${RELMEM:-relmem}
models=${MODELS:-rmc lstm}

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

run() {  # TASK MODEL SEED [OPTIONS...]: train, evaluate and plot OUT/TASK/MODEL-seedSEED
  local task=$1 model=$2 seed=$3
  shift 3
  local name=$model-seed$seed
  mkdir -p "$out/$task"
  timed "$out/$task/load-$name.log" "$relmem" train "$task" --model "$model" --seed "$seed" \
    --out-dir "$out/$task" --run-name "$name" "$@"
  "$relmem" eval "$out/$task/$name"
  "$relmem" plot "$out/$task/$name"
}

case $family in
  lm)
    data=$1 example=${2:-}
    for seed in 0 1; do
      for model in $models; do run lm "$model" "$seed" --data-dir "$data"; done
    done
    if [[ -n $example ]]; then
      (cd "$example" && timed "$out/load-word_language_model.log" env OMP_NUM_THREADS=1 \
        python main.py --data "$data" --epochs 1 --save "$out/word_language_model.pt") \
        >"$out/word_language_model.log" 2>&1
    fi
    ;;
  lte | minipacman | boxworld)
    for seed in 0 1; do
      for model in $models; do run "$family" "$model" "$seed"; done
    done
    ;;
  memory)
    for task in ${TASKS:-repeat-copy copy associative-recall}; do
      for model in ${MODELS:-dnc lstm}; do
        if [[ $task == repeat-copy || $model == lstm ]]; then
          run "$task" "$model" 0
        else
          for seed in 0 1; do run "$task" "$model" "$seed"; done
        fi
      done
    done
    ;;
  nth-farthest)
    for model in ${MODELS:-rmc lstm dnc}; do
      if [[ $model == dnc ]]; then
        run nth-farthest dnc 0 --preset dnc-cpu
      else
        run nth-farthest "$model" 0
      fi
    done
    ;;
  *)
    echo "quiet_round.sh: unknown family '$family' (lm, lte, minipacman, boxworld, memory or nth-farthest)" >&2
    exit 2
    ;;
esac
