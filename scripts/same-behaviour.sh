#!/usr/bin/env bash
# Checks that a change of the core left its behaviour alone: the simulator's per-seed lines
# (verdict and every figure of the run) in every mode, before and after, must be identical.
#
#   scripts/same-behaviour.sh record DIR [SEEDS]   # with the build before the change
#   scripts/same-behaviour.sh check DIR [SEEDS]    # with the build after it: diffs against DIR
#
# SIM (default target/release/redoubt-sim) is the binary to run; SEEDS defaults to 120, JOBS
# to the cores available.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:?record or check}
dir=${2:?a directory for the per-seed lines}
seeds=${3:-120}
sim=${SIM:-target/release/redoubt-sim}
jobs=${JOBS:-$(nproc)}
modes=(
  "default:"
  "all-optimizations:--all-optimizations"
  "hybrid:--hybrid"
  "quiet-primary:--quiet-primary"
  "separated:--separated"
  "firewall:--firewall"
  "prime:--ordering prime"
  "prime-bounded:--ordering prime --bounded-delay"
  "prime-separated:--ordering prime --separated"
)
mkdir -p "$dir"
status=0
for m in "${modes[@]}"; do
  name=${m%%:*}
  flags=${m#*:}
  out=$(mktemp)
  # shellcheck disable=SC2086
  "$sim" $flags --seeds "$seeds" --jobs "$jobs" --per-seed 2>/dev/null | grep '^seed ' | sort -n -k2 > "$out" || true
  case $what in
    record)
      mv "$out" "$dir/$name.txt"
      echo "$name: $(wc -l < "$dir/$name.txt") seeds recorded"
      ;;
    check)
      if diff -q "$dir/$name.txt" "$out" > /dev/null; then
        echo "$name: $(wc -l < "$out") seeds, identical"
      else
        echo "$name: DIFFERENT (first differing lines below)"
        diff "$dir/$name.txt" "$out" | head -6 || true
        status=1
      fi
      rm -f "$out"
      ;;
    *) echo "unknown command $what" >&2; exit 2 ;;
  esac
done
exit $status
