#!/bin/bash
# the next new-ranker runs, each as a core frees
cd /work/runs/s9
wait_for() { while pgrep -f "runs-new.sh train $1 " > /dev/null; do sleep 15; done; }
wait_for dnc-prox-seed0-800
./runs-new.sh train dnc-prox-seed2-800 dnc 2 800 &
wait_for dnc-prox-seed1-800
./runs-new.sh train none-prox-seed0-1200 none 0 1200 &
wait_for dnc-prox-seed2-800
./runs-new.sh train none-prox-seed1-1200 none 1 1200 &
wait
