#!/bin/bash
# S4's paired differences (studies/ladder/README.md, "S4"): broad, question-agnostic, B = 128 of 1,024, seed 3.
#   studies/ladder/s4_pairs.sh OUT    (OUT: s4.sh's folder; run from the repository root)
set -eu
F=${1:?OUT folder}/broad-agnostic-B128.json
pair() { echo "$1 - $2 ($3):"; python -m studies.kvzip.pairs --metric "$3" "$F:$4" "$F:$5" | tail -1; }
S=search-fixed-B128 K="uniform-kvzip[allocation=model]"
pair search "kvzip model" score $S "$K"; pair search "kvzip model" kl $S "$K"
pair search h2o score $S uniform-h2o; pair search h2o kl $S uniform-h2o
pair search streaming_llm score $S uniform-streaming_llm; pair search streaming_llm kl $S uniform-streaming_llm
pair "kvzip model" h2o score "$K" uniform-h2o; pair "kvzip model" h2o kl "$K" uniform-h2o
pair FullKV search score full $S
