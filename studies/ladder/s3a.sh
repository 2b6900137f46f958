#!/bin/bash
# Slice S3a of the ladder (studies/ladder/README.md): S1c's four starts measured on question-aware calibration
# samples (32: 16 evidence + 16 prose, seed 7), no move. Calibration only.
#   studies/ladder/s3a.sh OUT    (from the repository root)
set -eu
OUT=${1:?OUT folder}
mkdir -p "$OUT"
[ -f "$OUT/h24-signals.json" ] || xz -dc studies/kvzip/h24-signals.json.xz > "$OUT/h24-signals.json"
polykv-search solve --method search --start studies/kvzip/h24-ilp-head-pooled-B128.json \
    --signals "$OUT/h24-signals.json" --budget 128 --phases prefill --samples 32 --mix 16 --sample-seed 7 \
    --protocol question-aware --max-evaluations 4 --out "$OUT/starts-32-aware.json"
