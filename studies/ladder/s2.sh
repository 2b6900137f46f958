#!/bin/bash
# Slice S2 of the ladder (studies/ladder/README.md): S1b's cell in the question-aware protocol. One ruler score run
# of FullKV, uniform kvzip `model` and S1b's searched strategy on H18's draw. Resumable from OUT/*.partial.
#   studies/ladder/s2.sh OUT    (from the repository root)
set -eu
OUT=${1:?OUT folder}
mkdir -p "$OUT"
polykv-search score --suite ruler --context-len 1024 --budget 128 --samples 50 --seed 40 --question-aware \
    --baseline full --baseline 'uniform:kvzip[allocation=model]' --strategy studies/ladder/s1b/search-fixed-B128.json \
    --no-table --out "$OUT/ruler-aware-B128.json"
