#!/bin/bash
# after reeval-all.sh: the third seeds, and the readers without memory at step 800
while pgrep -f reeval-all.sh > /dev/null || pgrep -f "runs.sh train dnc-control-seed2" > /dev/null; do sleep 20; done
R=/work/runs
S=/work/runs/s9/reeval.sh
$S $R/s9/art/dnc-control-seed2-800 s9_art_dnc-control-seed2-800 bm25-proximity
$S $R/s9/art/dnc-control-seed2-800 s9_art_dnc-control-seed2-800 bm25
$S $R/s9/art/none-control-seed2-1200 s9_art_none-control-seed2-1200 bm25-proximity
$S $R/s9/art/none-control-seed2-1200 s9_art_none-control-seed2-1200 bm25
for run in s6/art/none-ranked-seed0-1200 s6/art/none-ranked-seed1-1200 s9/art/none-control-seed2-1200; do
  $S $R/$run $(echo $run | tr / _)-step800 bm25-proximity step-00000800
done
