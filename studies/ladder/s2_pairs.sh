#!/bin/bash
# S2's paired differences (studies/ladder/README.md, "S2"): ruler, question-aware, B = 128 of 1,024, H18's draw.
#   studies/ladder/s2_pairs.sh OUT    (OUT: s2.sh's folder; run from the repository root)
set -eu
F=${1:?OUT folder}/ruler-aware-B128.json
pair() { echo "$1 - $2:"; python -m studies.kvzip.pairs "$F:$3" "$F:$4" | tail -1; }
pair "search" "kvzip model (H-L1: not below; H-L2: above)" search-fixed-B128 "uniform-kvzip[allocation=model]"
pair "FullKV" "search" full search-fixed-B128
pair "FullKV" "kvzip model" full "uniform-kvzip[allocation=model]"
