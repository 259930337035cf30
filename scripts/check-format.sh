#!/usr/bin/env bash
# Fails when a tracked C++ file differs from what clang-format (.clang-format) makes of it.
# `make format` applies the style; .ci/run calls this first.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "check-format: clang-format not installed (scripts/install-deps.sh)" >&2; exit 2; }
bad=()
while IFS= read -r f; do
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done < <(git ls-files '*.h' '*.cpp')
if [ ${#bad[@]} -gt 0 ]; then
  echo "check-format: ${#bad[@]} file(s) are not clang-formatted (run 'make format'):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "check-format: $(git ls-files '*.h' '*.cpp' | wc -l) files formatted"
