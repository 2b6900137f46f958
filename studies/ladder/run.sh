#!/bin/bash
# The budget ladder (studies/ladder/README.md), every step resumable; run from the repository root:
#   studies/ladder/run.sh OUT [1k|4k|all]
# collect and solve --method search / pool-prior keep journals (OUT/*.journal); score keeps its checkpoint.
set -eu
OUT=${1:?OUT folder} PART=${2:-all}
mkdir -p "$OUT"
HP='streaming_llm,snapkv,h2o,kvzip[allocation=model]'
KV='uniform:kvzip[allocation=model]'
KVP='uniform:kvzip[allocation=model,plus=true]'

table() {  # $1: context length, $2: head-cell budgets, $3: table path
    polykv-search collect --samples 4 --retrieval-heads 4 --context-len "$1" --continuation-len 32 \
        --head-cells "$2" --head-patterns "$HP" --patterns snapkv --budgets 256 --phases prefill --layers 0 \
        --out "$3"
}
solves() {  # $1: table, $2: budget, $3: prefix
    polykv-search solve --method ilp --granularity head --signals "$1" --budget "$2" --out "$3-ilp-head-B$2.json"
    polykv-search solve --method search --start "$3-ilp-head-B$2.json" --signals "$1" --budget "$2" \
        --phases prefill --out "$3-search-B$2.json"
    polykv-search solve --method pool-prior --signals "$1" --budget "$2" --phases prefill --out "$3-prior-B$2.json"
}
score() {  # $1: context length, $2: budget, $3: prefix, $4: suite, $5: samples, $6: protocol flag or ''
    local p=agnostic full=()
    [ -n "$6" ] && p=aware
    [ "$2" = "$7" ] && full=(--baseline full)  # FullKV once per length and protocol, at the first rung
    polykv-search score --suite "$4" --context-len "$1" --budget "$2" --samples "$5" --seed 40 $6 "${full[@]}" \
        --baseline "$KV" --baseline "$KVP" --baseline uniform:tova \
        --strategy "$3-ilp-head-B$2.json" "$3-search-B$2.json" "$3-prior-B$2.json" \
        --no-table --out "$OUT/$4-$p-$1-B$2.json"
}

if [ "$PART" = 1k ] || [ "$PART" = all ]; then
    # the kvzip study's table (H24) plus head cells at 32: collect measures only what the table lacks
    [ -f "$OUT/signals-1k.json" ] || xz -dc studies/kvzip/h24-signals.json.xz > "$OUT/signals-1k.json"
    table 1024 32,64,128,256 "$OUT/signals-1k.json"
    for B in 256 128 64; do solves "$OUT/signals-1k.json" $B "$OUT/1k"; done
    for P in '' --question-aware; do
        for B in 256 128 64; do
            score 1024 $B "$OUT/1k" ruler 50 "$P" 256
            score 1024 $B "$OUT/1k" broad 100 "$P" 256
        done
    done
fi
if [ "$PART" = 4k ] || [ "$PART" = all ]; then
    table 4096 128,256,512,1024 "$OUT/signals-4k.json"
    for B in 1024 512; do solves "$OUT/signals-4k.json" $B "$OUT/4k"; done
    for P in '' --question-aware; do
        for B in 1024 512; do score 4096 $B "$OUT/4k" ruler 50 "$P" 1024; done
    done
fi
