#!/bin/bash
# H17 (studies/kvzip/study_kvzip_plan.md): the niah tasks' second draw (the question-agnostic second draw's samples)
# scored question-aware, B = 256 then 128, one task at a time; a run is skipped when its results file or its
# committed copy studies/kvzip/h17-aware-TASK-draw2-BBUDGET.json.xz exists, and resumes from its .partial (or
# from a copy committed under studies/kvzip/partial/ at a session's end).
# Usage: studies/kvzip/run_aware_niah2.sh OUTDIR   (from the repository root)
set -u
OUT=${1:?usage: run_aware_niah2.sh OUTDIR}
S=studies/kvzip
mkdir -p "$OUT"
UNIFORMS=(--baseline full)
for p in tova snapkv h2o streaming_llm kvzip keydiff expected_attention; do UNIFORMS+=(--baseline "uniform:$p"); done
B256=(--strategy $S/h10-ilp-old.json $S/h10-ilp-widened.json $S/duo.json $S/headkv.json
  $S/ilp-head-streaming.json $S/ilp-head-combined.json)
B128=(--strategy $S/h13-ilp-old-B128.json $S/h13-ilp-widened-B128.json $S/h13-prop-old-B128.json
  $S/h13-prop-widened-B128.json $S/h15-ilp-head-combined-B128.json $S/h15-ilp-head-streaming-B128.json
  $S/h15-duo-B128.json $S/h15-headkv-B128.json)
TASKS=(niah_single niah_multikey niah_multivalue niah_multiquery)
for budget in 256 128; do
  for i in "${!TASKS[@]}"; do
    name="h17-aware-${TASKS[$i]}-draw2-B$budget.json"
    out="$OUT/$name"
    [ -f "$out" ] || [ -f "$S/$name" ] || [ -f "$S/$name.xz" ] && continue
    [ -f "$S/partial/$name.partial" ] && [ ! -f "$out.partial" ] && cp "$S/partial/$name.partial" "$out.partial"
    strategies=("${B256[@]}")
    [ $budget = 128 ] && strategies=("${B128[@]}")
    flock /tmp/heavy.lock polykv-search score --suite "ruler/${TASKS[$i]}" --context-len 1024 --budget $budget \
      --samples 50 --seed $((20 + i)) --question-aware "${UNIFORMS[@]}" "${strategies[@]}" --jobs 2 \
      --out "$out" >> "$out.log" 2>&1
    echo "$(date +%T) B=$budget ${TASKS[$i]} rc=$?" >> "$OUT/progress"
  done
done
