#!/usr/bin/env bash
# Runs each libFuzzer target of BUILD_DIR for SECONDS from its corpus in tests/fuzz/corpus/<t>/
# (read only: new inputs go to a temporary directory). A crash, leak or sanitizer report fails,
# leaving the input in the temporary directory named in the message.
#   scripts/fuzz.sh BUILD_DIR [SECONDS]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:?build dir}"
secs="${2:-30}"
for t in wire gguf http json; do
  bin="$build/bin/fuzz_$t"
  [ -x "$bin" ] || { echo "fuzz: $bin not built" >&2; exit 1; }
  work="$(mktemp -d "${TMPDIR:-/tmp}/moesh-fuzz-$t.XXXXXX")"
  echo "fuzz: $t for ${secs}s (corpus tests/fuzz/corpus/$t, new inputs and artifacts in $work)"
  if ! "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$work/" "$work" "$root/tests/fuzz/corpus/$t" >"$work/log" 2>&1; then
    tail -n 60 "$work/log" >&2
    echo "fuzz: $t FAILED (artifacts in $work)" >&2
    exit 1
  fi
  grep -E "stat::number_of_executed_units|stat::new_units_added" "$work/log" | tr '\n' ' '
  echo
  rm -rf "$work"
done
echo "fuzz: no crashes"
