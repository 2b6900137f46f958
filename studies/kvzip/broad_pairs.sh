#!/bin/bash
# The broad hypotheses (H11's, studies/kvzip/study_kvzip_plan.md; at B = 128 the same entries, H13/H15 names) on one
# broad results file:
#   studies/kvzip/broad_pairs.sh FILE BEST_SCORE BEST_KL SUFFIX
#   e.g. studies/kvzip/broad_pairs.sh studies/kvzip/h13-agnostic-broad.json.xz uniform-streaming_llm uniform-h2o -B128
# BEST_SCORE / BEST_KL: the best uniform by broad score / by continuation KL on the file's own samples
# (`polykv-search compare FILE --tasks`); SUFFIX: the strategy files' suffix ("-B128"; "" for H10/H11's names).
set -eu
F=${1:?FILE} BS=${2:?BEST_SCORE} BK=${3:?BEST_KL} X=${4-}
case "$X" in -B128) IW=h13-ilp-widened-B128 IO=h13-ilp-old-B128 C=h15-ilp-head-combined-B128 S=h15-ilp-head-streaming-B128 ;;
  *) IW=h10-ilp-widened IO=h10-ilp-old C=ilp-head-combined S=ilp-head-streaming ;; esac
pair() { python -m studies.kvzip.pairs "$@" | tail -1; }
echo "ilp(widened) KL - best-KL uniform (H11a)"; pair --metric kl "$F:$IW" "$F:$BK"
echo "ilp(widened) - ilp(old), KL then score (H11b)"; pair --metric kl "$F:$IW" "$F:$IO"; pair "$F:$IW" "$F:$IO"
echo "combined - best uniform, score (H11c)"; pair "$F:$C" "$F:$BS"
echo "combined - ilp(old), KL (H11c)"; pair --metric kl "$F:$C" "$F:$IO"
echo "combined - best-KL uniform, KL"; pair --metric kl "$F:$C" "$F:$BK"
echo "streaming-only - best uniform, score; combined - streaming-only, score"; pair "$F:$S" "$F:$BS"; pair "$F:$C" "$F:$S"
echo "ilp(widened) - best uniform, score"; pair "$F:$IW" "$F:$BS"
echo "kvzip - tova, score"; pair "$F:uniform-kvzip" "$F:uniform-tova"
echo "FullKV - combined, score"; pair "$F:full" "$F:$C"
