#!/bin/bash
# S5's paired differences (studies/ladder/README.md, "S5"), against S2's file (same draw, same protocol).
#   studies/ladder/s5_pairs.sh OUT    (OUT: s5.sh's folder; run from the repository root)
set -eu
F=${1:?OUT folder}/ruler-aware-B128-s5.json S2=studies/ladder/s2/ruler-aware-B128.json.xz
pair() { echo "$1 - $2:"; python -m studies.kvzip.pairs "$3" "$4" | tail -1; }
pair "aware search" "kvzip model (H-L1)" "$F:search-aware-B128" "$S2:uniform-kvzip[allocation=model]"
pair "aware search" "S1b's search" "$F:search-aware-B128" "$S2:search-fixed-B128"
pair "FullKV" "aware search" "$S2:full" "$F:search-aware-B128"
