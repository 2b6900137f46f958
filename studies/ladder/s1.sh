#!/bin/bash
# Slice S1 of the ladder (studies/ladder/README.md): the search at B = 128 of 1,024, then one ruler score run
# (question-agnostic, H18's draw) of its strategy and uniform KVzip+. Resumable: the search journals, score checkpoints.
#   studies/ladder/s1.sh OUT    (from the repository root)
set -eu
OUT=${1:?OUT folder}
mkdir -p "$OUT"
[ -f "$OUT/h24-signals.json" ] || xz -dc studies/kvzip/h24-signals.json.xz > "$OUT/h24-signals.json"
[ -f "$OUT/search-fixed-B128.json" ] || polykv-search solve --method search --start studies/kvzip/h24-ilp-head-pooled-B128.json \
    --signals "$OUT/h24-signals.json" --budget 128 --phases prefill --max-evaluations 40 --out "$OUT/search-fixed-B128.json"
polykv-search score --suite ruler --context-len 1024 --budget 128 --samples 50 --seed 40 \
    --baseline 'uniform:kvzip[allocation=model,plus=true]' --strategy "$OUT/search-fixed-B128.json" \
    --no-table --out "$OUT/ruler-agnostic-B128.json"
