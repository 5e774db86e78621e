#!/bin/bash
R=/work/runs
for ranker in bm25-proximity bm25; do
  for run in s8/art/dnc-control-seed0-800 s8/art/dnc-control-seed1-800 s6/art/dnc-ranked-seed0-800 s6/art/dnc-ranked-seed1-800 s6/art/none-ranked-seed0-1200 s6/art/none-ranked-seed1-1200 s8/art/dnc-inloss-seed0-800 s8/art/dnc-inloss-seed1-800; do
    /work/runs/s9/reeval.sh $R/$run $(echo $run | tr / _) $ranker
  done
done
