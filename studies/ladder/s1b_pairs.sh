#!/bin/bash
# S1b's paired differences (studies/ladder/README.md, "S1b"), ruler, question-agnostic, B = 128 of 1,024, H18's
# draw; pairs by sample id across S1b's own run and the committed H18 / H24 runs:
#   studies/ladder/s1b_pairs.sh OUT    (OUT: s1.sh's folder; run from the repository root)
set -eu
OUT=${1:?OUT folder}
S1B=$OUT/ruler-agnostic-B128.json H18=studies/kvzip/h18-agnostic-B128.json H24=studies/kvzip/h24-agnostic.json
KV="$H18:uniform-kvzip[allocation=model]"
pair() { echo "$1 - $2:"; python -m studies.kvzip.pairs "$3" "$4" | tail -1; }
pair "search" "kvzip model (H-L1: not below; H-L2: above)" "$S1B:search-fixed-B128" "$KV"
pair "search" "its start, H24's ilp (no direction: do the moves carry over?)" "$S1B:search-fixed-B128" "$H24:h24-ilp-head-pooled-B128"
pair "KVzip+" "kvzip model" "$S1B:uniform-kvzip[allocation=model,plus=true]" "$KV"
pair "FullKV" "search" "$H18:full" "$S1B:search-fixed-B128"
pair "FullKV" "KVzip+" "$H18:full" "$S1B:uniform-kvzip[allocation=model,plus=true]"
