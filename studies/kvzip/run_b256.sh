#!/bin/bash
# H16 (studies/kvzip/study_kvzip_plan.md): the B = 256 entries issue 25 and 26 still lack, one run at a time, each skipped
# when its results file or its committed copy studies/kvzip/h16-PROTOCOL-TASK.json.xz exists (a stopped run
# resumes from its .partial, or, in a fresh checkout, from the copy committed under studies/kvzip/partial/).
# Usage: studies/kvzip/run_b256.sh OUTDIR   (from the repository root)
set -u
OUT=${1:?usage: run_b256.sh OUTDIR}
S=studies/kvzip
mkdir -p "$OUT"
uniforms() { for p in "$@"; do printf -- '--baseline\nuniform:%s\n' "$p"; done; }
mapfile -t NEW_UNIFORMS < <(uniforms tova snapkv h2o streaming_llm)
mapfile -t ALL_UNIFORMS < <(uniforms tova snapkv h2o streaming_llm kvzip keydiff expected_attention)
HEADS=($S/duo.json $S/headkv.json $S/ilp-head-streaming.json $S/ilp-head-combined.json)
PROPS=($S/h13-prop-old-B256.json $S/h13-prop-widened-B256.json)
H11=(--baseline full "${ALL_UNIFORMS[@]}" --strategy $S/h10-ilp-old.json $S/h10-ilp-widened.json "${HEADS[@]}")
run() {  # protocol suite seed samples name -- score arguments
  local protocol=$1 suite=$2 seed=$3 samples=$4 name=$5 extra=()
  shift 6
  local out="$OUT/h16-$protocol-$name.json"
  [ "$protocol" = aware ] && extra=(--question-aware)
  [ -f "$out" ] || [ -f "$S/h16-$protocol-$name.json" ] || [ -f "$S/h16-$protocol-$name.json.xz" ] && return
  local saved="$S/partial/h16-$protocol-$name.json.partial"  # an unfinished run's checkpoint, committed at a session's end
  [ -f "$saved" ] && [ ! -f "$out.partial" ] && cp "$saved" "$out.partial"
  flock /tmp/heavy.lock polykv-search score --suite "$suite" --context-len 1024 --budget 256 --samples "$samples" \
    --seed "$seed" "${extra[@]}" "$@" --jobs 2 --out "$out" >> "$out.log" 2>&1
  echo "$(date +%T) $protocol $name rc=$?" >> "$OUT/progress"
}
TASKS=(niah_single niah_multikey niah_multivalue niah_multiquery vt cwe)
for i in "${!TASKS[@]}"; do
  run agnostic "ruler/${TASKS[$i]}" $((2 + i)) 50 "${TASKS[$i]}" -- "${NEW_UNIFORMS[@]}" --strategy $S/duo.json $S/headkv.json
done
# the niah second draw before the question-aware runs: issue 25's B = 256 target is question-agnostic
for i in 0 1 2 3; do run agnostic "ruler/${TASKS[$i]}" $((20 + i)) 50 "${TASKS[$i]}-draw2" -- "${H11[@]}"; done
for i in "${!TASKS[@]}"; do
  run aware "ruler/${TASKS[$i]}" $((2 + i)) 50 "${TASKS[$i]}" -- "${NEW_UNIFORMS[@]}" --strategy "${HEADS[@]}"
done
run agnostic broad 2 100 broad -- --baseline uniform:tova --strategy "${PROPS[@]}"
run aware broad 2 100 broad -- "${H11[@]}" "${PROPS[@]}"
