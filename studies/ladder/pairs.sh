#!/bin/bash
# The ladder's planned differences (studies/ladder/README.md), from run.sh's files; run from the repository root:
#   studies/ladder/pairs.sh OUT
# Each block: A - B per task and the task-stratified paired 95 % interval (studies.kvzip.pairs). Entries are
# named as score names them: baselines by their spec, strategies by their file's stem (1k-search-B128, ...).
# The best uniform of a column is the higher-scoring of uniform-tova and the pool; both are printed
# ("prior - uniform-kvzip[allocation=model]" is H-L3: the pool with priors against the plain pool).
set -eu
OUT=${1:?OUT folder}
pair() { python -m studies.kvzip.pairs "$@" | tail -1; }
KV='uniform-kvzip[allocation=model]'
rungs() { [ "$1" = 1024 ] && echo "256 128 64" || echo "1024 512"; }
for N in 1024 4096; do
    K=$([ "$N" = 1024 ] && echo 1k || echo 4k)
    for P in agnostic aware; do
        for S in ruler broad; do
            set -- $(rungs $N)
            FULL=$OUT/$S-$P-$N-B$1.json  # FullKV is scored at the first rung only
            for B in $(rungs $N); do
                F=$OUT/$S-$P-$N-B$B.json
                [ -f "$F" ] || continue
                echo "== $S, $P, $N tokens, B = $B"
                for U in "$KV" uniform-tova; do
                    echo "search - $U:"; pair "$F:$K-search-B$B" "$F:$U"
                    [ "$S" = broad ] && { echo "  KL:"; pair --metric kl "$F:$K-search-B$B" "$F:$U"; }
                    echo "prior - $U:"; pair "$F:$K-prior-B$B" "$F:$U"
                done
                echo "FullKV - search:"; pair "$FULL:full" "$F:$K-search-B$B"
            done
        done
    done
done
