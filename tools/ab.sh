#!/bin/sh
# ab.sh - A/B decode throughput of several revisions in one GPU machine session: the same bench command
# on each in turn, alternating, so that the machine's drift (clocks, a neighbour, another host) falls
# on every revision alike.
#
#   sh tools/ab.sh prepare REV...            # here: export each revision (git archive; "." = the tracked
#                                            # files as they are now) into build/ab/<n>-<name>
#   sh tools/ab.sh run [ROUNDS] [-- ARGS]    # on the GPU machine (carry build/ab): build tools/bench in each,
#                                            # compile its kernels once into a cache that all share (its files
#                                            # are keyed by the source), then ROUNDS (default 2) rounds of every
#                                            # revision's bench with ARGS (a tree's ab.env, if any, is sourced
#                                            # first: the same code under other tuning switches)
#
# (AB_DIR names another folder than build/ab: two sets of trees prepared and carried together.)
#
# ARGS default to "--no-ceilings --batches 1,8,32 --no-long --graphs --prefill 16 --prefill-reps 1
# --steps 10".  Results go to build/ab/out as <n>-<name>.<round>.json (and .txt, the bench's output), and a
# table of the decode rows' tok/s is printed (one line per revision and round), then each revision's means
# over the rounds with the change against the first revision's, and whether every row's last-step hash
# equals the first revision's in the same round (the same bits).  With $OUT set (the device
# tool's output folder, which takes only a few files) the table and one archive of build/ab/out go there:
# $OUT/ab.txt and $OUT/ab.tgz.
#
#   sh tools/ab.sh table [DIR]               # anywhere: that table again from the JSON files in DIR (default
#                                            # build/ab/out; e.g. an unpacked ab.tgz)
#   sh tools/ab.sh load LAYERS [ROUNDS] [-- ARGS]
#                                            # on the GPU machine: a checkpoint of LAYERS layers of the real shape
#                                            # (the first tree's tools/make_tiny_model --real-shape, in $AB_MODEL or
#                                            # /tmp/ab-real<LAYERS>; kept for later calls), then ROUNDS (default 1)
#                                            # rounds of every revision's tools/long_context --model on it with ARGS
#                                            # (default "--tokens 8192 --chunk 2048 --max-chunk 2048 --gen 32"); a
#                                            # table of load time, host heap, device memory, prefill and decode
#                                            # tok/s and the greedy tokens' hash ($OUT/ab-load.txt with $OUT set)
#
# Later calls on the same (still held) machine find the trees built and their kernels cached: to profile one
# of them, run `cd build/ab/<n>-<name> && QSA_CACHE_DIR=/tmp/qsa-ab-cache/shared ./tools/bench ...` *without*
# carrying build/ab again — a carried copy replaces the machine's built trees with this checkout's unbuilt ones.
set -eu
dir=${AB_DIR:-build/ab} # (another folder in $AB_DIR: two sets of trees carried together)
# table DIR: the tok/s table of the bench JSON files in DIR (<n>-<name>.<round>.json), each revision's means and
# changes, and the last-step hashes against the first revision's
table() {
    python3 - "$1" <<'EOF'
import glob, json, os, re, sys
out = sys.argv[1]
rows, table, fnv = [], [], {}
for f in sorted(glob.glob(os.path.join(out, '*.json')), key=lambda p: (p.rsplit('.', 2)[1], p)):
    try:
        d = json.load(open(f))
    except (OSError, ValueError):
        continue
    name = os.path.basename(f)[:-5]
    r = {}
    for x in d.get('results', []):
        if x.get('what') != 'decode' or x.get('status') != 'measured':
            continue
        r[x['config']] = x['tok_s']
        h = re.search(r'fnv ([0-9a-f]+)', x.get('note', ''))
        if h: fnv[(name, x['config'])] = h.group(1)
    for k in r:
        if k not in rows: rows.append(k)
    table.append((name, r))
print('tok/s | ' + ' | '.join(rows))
for name, r in table:
    print(name + ' | ' + ' | '.join('%.1f' % r[k] if k in r else '-' for k in rows))
# each tree's means over its rounds, the change against the first tree's, and whether every row's last-step
# hash (the bench's "fnv" of the last step's logits or ids) is the first tree's of the same round
trees = []
for name, _ in table:
    if name.rsplit('.', 1)[0] not in trees: trees.append(name.rsplit('.', 1)[0])
mean = {}
for t in trees:
    for k in rows:
        v = [r[k] for name, r in table if name.rsplit('.', 1)[0] == t and k in r]
        if v: mean[(t, k)] = sum(v) / len(v)
print()
print('mean (change) | ' + ' | '.join(rows))
for t in trees:
    cells = []
    for k in rows:
        if (t, k) not in mean: cells.append('-'); continue
        c = '%.1f' % mean[(t, k)]
        if t != trees[0] and (trees[0], k) in mean and mean[(trees[0], k)] > 0:
            c += ' (%+.1f%%)' % (100.0 * (mean[(t, k)] / mean[(trees[0], k)] - 1.0))
        cells.append(c)
    print(t + ' | ' + ' | '.join(cells))
for t in trees[1:]:
    diff = [name.rsplit('.', 1)[1] + ': ' + k for name, _ in table if name.rsplit('.', 1)[0] == t for k in rows
            if (name, k) in fnv and fnv.get((trees[0] + '.' + name.rsplit('.', 1)[1], k)) not in (None, fnv[(name, k)])]
    same = sum(1 for name, _ in table if name.rsplit('.', 1)[0] == t for k in rows
               if (name, k) in fnv and fnv.get((trees[0] + '.' + name.rsplit('.', 1)[1], k)) == fnv[(name, k)])
    print('%s: last-step hashes %s' % (t, 'all %d equal to %s\'s' % (same, trees[0]) if not diff else
                                       '%d equal, DIFFERENT in round %s' % (same, '; '.join(diff))))
EOF
}
# load_table DIR: the figures tools/long_context printed in DIR/<n>-<name>.<round>.txt, a line each
load_table() {
    python3 - "$1" <<'EOF'
import glob, os, re, sys
pats = [('load s', r'(?<!up)loaded in ([0-9.]+) s'), ('heap MiB', r'host heap: .*? ([0-9.]+) MiB after the load'),
        ('heap peak MiB', r'\(([0-9.]+) MiB at its peak\)'), ('device MiB after load', r'after load ([0-9.]+) MiB'),
        ('upload s', r'uploaded in ([0-9.]+) s'), ('upload GB/s', r'uploaded in [0-9.]+ s, ([0-9.]+) GB/s'),
        ('fill s', r'filling the stage ([0-9.]+) s'), ('wait s', r'waiting on copies ([0-9.]+) s'),
        ('prefill tok/s', r'prefill +([0-9.]+) tok/s'), ('decode tok/s', r'decode +([0-9.]+) tok/s'),
        ('tokens fnv', r'tokens fnv1a (0x[0-9a-f]+)')]
print('tree.round | ' + ' | '.join(p[0] for p in pats))
for f in sorted(glob.glob(os.path.join(sys.argv[1], '*.[0-9]*.txt')), key=lambda p: (p.rsplit('.', 2)[1], p)):
    t = open(f).read()
    cells = [(lambda m: m.group(1) if m else '-')(re.search(p, t)) for _, p in pats]
    print(os.path.basename(f)[:-4] + ' | ' + ' | '.join(cells))
EOF
}
cmd=${1:-}
[ -n "$cmd" ] && shift
case "$cmd" in
prepare)
    [ $# -ge 1 ] || { echo "usage: sh tools/ab.sh prepare REV..." >&2; exit 2; }
    rm -rf "$dir"
    mkdir -p "$dir"
    n=0
    for rev in "$@"; do
        n=$((n + 1))
        name=$(printf '%s' "$rev" | tr -c 'A-Za-z0-9._-' '_')
        [ "$rev" = . ] && name=worktree
        d="$dir/$n-$name"
        mkdir -p "$d"
        src=$rev
        if [ "$rev" = . ]; then # the tracked files as they are now (a commit object that no branch holds)
            src=$(git stash create)
            [ -n "$src" ] || src=HEAD
        fi
        git archive "$src" | tar -x -C "$d"
        echo "$d: $(git rev-parse --short "$rev^{commit}" 2>/dev/null || git rev-parse --short HEAD)$([ "$rev" = . ] && echo ' + working tree changes')"
    done
    du -sh "$dir" | sed 's/^/size to carry: /'
    ;;
run)
    rounds=2
    case "${1:-}" in [0-9]*) rounds=$1; shift ;; esac
    [ "${1:-}" = -- ] && shift
    args=${*:-"--no-ceilings --batches 1,8,32 --no-long --graphs --prefill 16 --prefill-reps 1 --steps 10"}
    out=$(pwd)/$dir/out
    rm -rf "$out"
    mkdir -p "$out"
    trees=$(ls -d "$dir"/[0-9]*-* 2>/dev/null) || true
    [ -n "$trees" ] || { echo "ab.sh: nothing in $dir (sh tools/ab.sh prepare REV... first)" >&2; exit 2; }
    for d in $trees; do (cd "$d" && make -j8 tools/bench > "$out/$(basename "$d").build.txt" 2>&1) &
    done
    wait
    for d in $trees; do
        if [ ! -x "$d/tools/bench" ]; then
            echo "ab.sh: $d did not build (see $out/$(basename "$d").build.txt)" >&2
            [ -z "${OUT:-}" ] || cp "$out/$(basename "$d").build.txt" "$OUT/"
            exit 1
        fi
        # the kernels once into the shared cache (a warm JIT for every timed run)
        (cd "$d" && QSA_CACHE_DIR="/tmp/qsa-ab-cache/shared" ./tools/bench --quick --no-ceilings > /dev/null 2>&1) ||
            echo "ab.sh: $d: the warm-up run failed" >&2
    done
    for r in $(seq 1 "$rounds"); do
        for d in $trees; do
            b=$(basename "$d")
            # (a tree's ab.env, if any, sets its environment)
            # shellcheck disable=SC2086
            (cd "$d" && { [ ! -f ab.env ] || . ./ab.env; } &&
                QSA_CACHE_DIR="/tmp/qsa-ab-cache/shared" ./tools/bench $args --out "$out/$b.$r.json" > "$out/$b.$r.txt" 2>&1) ||
                echo "ab.sh: $b round $r: the bench failed (see $out/$b.$r.txt)" >&2
        done
    done
    table "$out" > "$out/table.txt"
    cat "$out/table.txt"
    if [ -n "${OUT:-}" ]; then
        cp "$out/table.txt" "$OUT/ab.txt"
        tar -czf "$OUT/ab.tgz" -C "$dir" out
    fi
    ;;
load)
    [ $# -ge 1 ] || { echo "usage: sh tools/ab.sh load LAYERS [ROUNDS] [-- ARGS]" >&2; exit 2; }
    layers=$1
    shift
    rounds=1
    case "${1:-}" in [0-9]*) rounds=$1; shift ;; esac
    [ "${1:-}" = -- ] && shift
    args=${*:-"--tokens 8192 --chunk 2048 --max-chunk 2048 --gen 32"}
    out=$(pwd)/$dir/out-load
    rm -rf "$out"
    mkdir -p "$out"
    trees=$(ls -d "$dir"/[0-9]*-* 2>/dev/null) || true
    [ -n "$trees" ] || { echo "ab.sh: nothing in $dir (sh tools/ab.sh prepare REV... first)" >&2; exit 2; }
    for d in $trees; do (cd "$d" && make -j8 tools/long_context tools/make_tiny_model > "$out/$(basename "$d").build.txt" 2>&1) &
    done
    wait
    model=${AB_MODEL:-/tmp/ab-real$layers}
    first=$(echo "$trees" | head -n 1)
    if [ ! -f "$model/model.safetensors" ]; then
        rm -rf "$model"
        "$first/tools/make_tiny_model" "$model" --real-shape "$layers" > "$out/model.txt" 2>&1 ||
            { cat "$out/model.txt" >&2; exit 1; }
    fi
    case " $args " in # the kernels into the shared cache first (the tiny model's request), so no load compiles
    *" --backend cpu "*) ;; # them (the CPU backend has none)
    *)
        for d in $trees; do
            (cd "$d" && QSA_CACHE_DIR="/tmp/qsa-ab-cache/shared" ./tools/long_context --tokens 64 --gen 4 > /dev/null 2>&1) ||
                echo "ab.sh: $d: the warm-up request failed" >&2
        done
        ;;
    esac
    for r in $(seq 1 "$rounds"); do
        for d in $trees; do
            b=$(basename "$d")
            # shellcheck disable=SC2086
            (cd "$d" && QSA_CACHE_DIR="/tmp/qsa-ab-cache/shared" ./tools/long_context --model "$model" $args > "$out/$b.$r.txt" 2>&1) ||
                echo "ab.sh: $b round $r: long_context failed (see $out/$b.$r.txt)" >&2
        done
    done
    load_table "$out" > "$out/table.txt"
    cat "$out/table.txt"
    [ -z "${OUT:-}" ] || { cp "$out/table.txt" "$OUT/ab-load.txt"; tar -czf "$OUT/ab-load.tgz" -C "$dir" out-load; }
    ;;
table)
    table "${1:-$dir/out}"
    ;;
*)
    sed -n '2,35p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
