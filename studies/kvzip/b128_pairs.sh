#!/bin/bash
# H13 + H15's planned paired differences (studies/kvzip/study_kvzip_plan.md) on the task shards of run_b128.sh:
#   studies/kvzip/b128_pairs.sh DIR PROTOCOL BEST   e.g. studies/kvzip/b128_pairs.sh studies/kvzip agnostic uniform-tova
# BEST: the best uniform by ruler score on the run's own samples (`polykv-search compare DIR/h13-PROTOCOL-*.json`).
set -eu
D=${1:?DIR} P=${2:?PROTOCOL} BEST=${3:?BEST}
F="$D/h13-$P-niah_*.json,$D/h13-$P-vt.json,$D/h13-$P-cwe.json"  # ruler only (broad is h13-$P-broad.json)
pair() { python -m studies.kvzip.pairs "$F:$1" "$F:$2" | tail -1; }
echo "H13a"; pair uniform-kvzip uniform-tova
echo "H13b"; pair h13-ilp-widened-B128 "$BEST"
echo "H13c"; pair h13-ilp-widened-B128 h13-ilp-old-B128; pair h13-prop-widened-B128 h13-prop-old-B128
pair h13-ilp-old-B128 h13-prop-old-B128; pair h13-ilp-widened-B128 h13-prop-widened-B128
echo "H15a"; pair h15-ilp-head-combined-B128 "$BEST"
echo "H15b"; pair h15-ilp-head-combined-B128 h13-ilp-old-B128
echo "H15c"; pair h15-ilp-head-combined-B128 h15-ilp-head-streaming-B128
pair h15-ilp-head-combined-B128 h15-duo-B128; pair h15-headkv-B128 uniform-tova
echo "FullKV - combined"; pair full h15-ilp-head-combined-B128
