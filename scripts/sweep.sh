#!/usr/bin/env bash
# A long simulator sweep in resumable chunks, one worker per lane.
#
#   scripts/sweep.sh DIR NAME:SEEDS:ARGS [NAME:SEEDS:ARGS ...]
#
# runs seeds 0..SEEDS-1 of each mode (ARGS are redoubt-sim's mode flags, e.g. "--ordering prime")
# in chunks of CHUNK seeds (default 500) with --jobs 1, and appends one line per chunk to
# DIR/results.txt: mode, first seed, last seed, pass or FAIL, seconds. Run again with the same
# arguments and it resumes after the last chunk recorded. A failing chunk's output is kept in
# DIR/NAME-FIRST.out. SIM (default target/release/redoubt-sim) is the binary; copy it into DIR
# first so that a rebuild does not change it under a running sweep.
set -uo pipefail
dir=${1:?a directory for results}
shift
sim=${SIM:-target/release/redoubt-sim}
chunk=${CHUNK:-500}
mkdir -p "$dir"
results="$dir/results.txt"
touch "$results"
for spec in "$@"; do
  name=${spec%%:*}
  rest=${spec#*:}
  seeds=${rest%%:*}
  args=${rest#*:}
  start=0
  last=$(awk -v m="$name" '$1 == m { e = $3 } END { if (e != "") print e }' "$results")
  [[ -n $last ]] && start=$((last + 1))
  while ((start < seeds)); do
    n=$((seeds - start < chunk ? seeds - start : chunk))
    t0=$(date +%s)
    # shellcheck disable=SC2086 # ARGS is a list of flags
    if "$sim" --jobs 1 --seeds "$n" --start-seed "$start" $args >"$dir/$name-$start.out" 2>&1; then
      verdict=pass
      rm -f "$dir/$name-$start.out"
    else
      verdict=FAIL
    fi
    echo "$name $start $((start + n - 1)) $verdict $(($(date +%s) - t0))" >>"$results"
    start=$((start + n))
  done
done
