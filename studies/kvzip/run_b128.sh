#!/bin/bash
# H13 + H15 (studies/kvzip/study_kvzip_plan.md): 16 entries at B = 128, one ruler task at a time, question-agnostic
# then question-aware, then broad in both protocols; each run skipped when its results file exists (a stopped run resumes from
# its .partial; or when its committed copy studies/kvzip/h13-PROTOCOL-TASK[-draw2].json.xz exists, as in a fresh
# checkout), then the second draw of the niah tasks (issue 25's 100 per niah task, `--seed 20+i`).
# Usage: studies/kvzip/run_b128.sh OUTDIR   (from the repository root)
set -u
OUT=${1:?usage: run_b128.sh OUTDIR}
S=studies/kvzip
mkdir -p "$OUT"
ENTRIES=(--baseline full)
for p in tova snapkv h2o streaming_llm kvzip keydiff expected_attention; do ENTRIES+=(--baseline "uniform:$p"); done
ENTRIES+=(--strategy $S/h13-ilp-old-B128.json $S/h13-ilp-widened-B128.json $S/h13-prop-old-B128.json
  $S/h13-prop-widened-B128.json $S/h15-ilp-head-combined-B128.json $S/h15-ilp-head-streaming-B128.json
  $S/h15-duo-B128.json $S/h15-headkv-B128.json)
run() {  # protocol suite seed samples [name suffix]
  local out="$OUT/h13-$1-${2//\//-}${5:-}.json" extra=()
  [ "$1" = aware ] && extra=(--question-aware)
  [ -f "$out" ] || [ -f "$S/h13-$1-${2#ruler/}${5:-}.json" ] || [ -f "$S/h13-$1-${2#ruler/}${5:-}.json.xz" ] && return
  flock /tmp/heavy.lock polykv-search score --suite "$2" --context-len 1024 --budget 128 --samples "$4" --seed "$3" \
    "${extra[@]}" "${ENTRIES[@]}" --jobs 2 --out "$out" >> "$out.log" 2>&1
  local rc=$?
  echo "$(date +%T) $1 $2${5:-} rc=$rc" >> "$OUT/progress"
}
TASKS=(niah_single niah_multikey niah_multivalue niah_multiquery vt cwe)
for protocol in agnostic aware; do
  for i in "${!TASKS[@]}"; do run $protocol "ruler/${TASKS[$i]}" $((2 + i)) 50; done
done
run agnostic broad 3 100
run aware broad 3 100
for i in 0 1 2 3; do run agnostic "ruler/${TASKS[$i]}" $((20 + i)) 50 -draw2; done
