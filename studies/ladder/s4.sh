#!/bin/bash
# Slice S4 of the ladder (studies/ladder/README.md): the guarantee on broad at B = 128, question-agnostic, H13's
# broad draw (seed 3), 100 samples per task. Resumable from OUT/*.partial.
#   studies/ladder/s4.sh OUT    (from the repository root)
set -eu
OUT=${1:?OUT folder}
mkdir -p "$OUT"
polykv-search score --suite broad --context-len 1024 --budget 128 --samples 100 --seed 3 \
    --baseline full --baseline 'uniform:kvzip[allocation=model]' --baseline uniform:h2o \
    --baseline uniform:streaming_llm --strategy studies/ladder/s1b/search-fixed-B128.json \
    --no-table --out "$OUT/broad-agnostic-B128.json"
