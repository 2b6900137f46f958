#!/bin/bash
# H16's planned paired differences (studies/kvzip/study_kvzip_plan.md) on the files of run_b256.sh, with the B = 256
# runs they pair with on the same samples (H7, H8, H9, H10, H12, H11):
#   studies/kvzip/b256_pairs.sh DIR a|b|d [BEST]   (BEST, for b: the best uniform of the run's own samples)
set -eu
D=${1:?DIR} PART=${2:?a, b or d} BEST=${3:-}
TASKS=(niah_single niah_multikey niah_multivalue niah_multiquery vt cwe)
list() { local IFS=,; echo "${*}"; }
pair() { python -m studies.kvzip.pairs "$@" | tail -1; }
case $PART in
a)  # question-agnostic ruler, H8's draw: this run's duo / headkv / uniforms with H7's head-level ilp
  F=$(list "${TASKS[@]/#/$D/h16-agnostic-}"); F=${F//,/.json,}.json
  pair "$F:duo" "$F:uniform-tova"; pair "$F:headkv" "$F:uniform-tova"
  pair "$D/h7-agnostic-50.json:ilp-head-combined" "$F:duo" ;;
b)  # question-aware ruler, H9's draw
  F=$(list "${TASKS[@]/#/$D/h16-aware-}"); F=${F//,/.json,}.json
  H9=$(list "${TASKS[@]/#/$D/h9-aware-}"); H9=${H9//,/.json,}.json
  best=$F; case $BEST in uniform-kvzip|uniform-keydiff|uniform-expected_attention) best=$H9 ;; esac
  pair "$F:ilp-head-combined" "$best:${BEST:?BEST}"; pair "$F:ilp-head-combined" "$F:duo"
  pair "$F:ilp-head-combined" "$F:ilp-head-streaming" ;;
d)  # the niah tasks, 100 each: H7's draw (its file holds combined, streaming-only, FullKV and tova) + the second
  N=niah_single,niah_multikey,niah_multivalue,niah_multiquery
  F="$D/h7-agnostic-50.json,$D/h16-agnostic-niah_*-draw2.json"
  pair --tasks $N "$F:ilp-head-combined" "$F:uniform-tova"; pair --tasks $N "$F:ilp-head-combined" "$F:ilp-head-streaming"
  pair --tasks $N "$F:full" "$F:ilp-head-combined" ;;
*) echo "PART must be a, b or d" >&2; exit 2 ;;
esac
