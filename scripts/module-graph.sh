#!/usr/bin/env bash
# The module diagram of docs/ARCHITECTURE.md. The build writes BUILD_DIR/modules.dot from the
# CMake target graph at configure time (the direct links between moesh_<module> libraries).
#   scripts/module-graph.sh [BUILD_DIR]          copies it to docs/modules.dot, renders docs/modules.svg
#   scripts/module-graph.sh [BUILD_DIR] --check  fails when docs/modules.dot differs from the build's
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="$(cd "${1:-$ROOT/build}" && pwd)"
MODE="${2:-write}"
GEN="$BUILD/modules.dot"
OUT="$ROOT/docs/modules.dot"
[ -f "$GEN" ] || { echo "module-graph: $GEN missing (configure the build first)" >&2; exit 2; }
if [ "$MODE" = "--check" ]; then
  if ! diff -u "$OUT" "$GEN"; then
    echo "module-graph: docs/modules.dot is stale; run scripts/module-graph.sh and commit it (and the .svg)" >&2
    exit 1
  fi
  echo "module-graph: docs/modules.dot matches the build graph ($(grep -c '^  ".*->' "$OUT") arrows)"
  exit 0
fi
cp "$GEN" "$OUT"
echo "module-graph: wrote $OUT"
if command -v dot >/dev/null 2>&1; then
  dot -Tsvg "$OUT" -o "$ROOT/docs/modules.svg"
  echo "module-graph: wrote $ROOT/docs/modules.svg"
else
  echo "module-graph: graphviz 'dot' not installed; docs/modules.svg not regenerated" >&2
fi
