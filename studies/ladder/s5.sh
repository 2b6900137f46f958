#!/bin/bash
# Slice S5 of the ladder (studies/ladder/README.md): S1b's search measured on question-aware calibration samples,
# then its result scored on ruler, aware, B = 128, H18's draw. Each step resumable (journal, OUT/*.partial).
#   studies/ladder/s5.sh OUT    (from the repository root)
set -eu
OUT=${1:?OUT folder}
mkdir -p "$OUT"
[ -f "$OUT/h24-signals.json" ] || xz -dc studies/kvzip/h24-signals.json.xz > "$OUT/h24-signals.json"
polykv-search solve --method search --start studies/kvzip/h24-ilp-head-pooled-B128.json \
    --signals "$OUT/h24-signals.json" --budget 128 --phases prefill --max-evaluations 40 --protocol question-aware \
    --out "$OUT/search-aware-B128.json"
polykv-search score --suite ruler --context-len 1024 --budget 128 --samples 50 --seed 40 --question-aware \
    --strategy "$OUT/search-aware-B128.json" --no-table --out "$OUT/ruler-aware-B128-s5.json"
