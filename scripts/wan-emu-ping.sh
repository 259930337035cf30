#!/usr/bin/env bash
# Manual check of `moesh wan-emu` (docs/wan-emu.md): a hub and two peers 40 ms and 10 ms away,
# `ping -c 3` from the hub to each (expect ~80 ms and ~20 ms) and from peer a to peer b (~100 ms),
# then `down`. Root only; needs ping (iputils-ping).
#   scripts/wan-emu-ping.sh [BUILD_DIR]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
MOESH="${1:-$ROOT/build}/bin/moesh"
NAME="ping$$"
[ "$(id -u)" = 0 ] || { echo "wan-emu-ping: needs root" >&2; exit 2; }
command -v ping >/dev/null || { echo "wan-emu-ping: ping not installed (apt-get install iputils-ping)" >&2; exit 2; }
OUT="$(mktemp)"
"$MOESH" wan-emu up --name "$NAME" --peer a:delay=40ms --peer b:delay=10ms >"$OUT" &
UP=$!
trap '"$MOESH" wan-emu down --name "$NAME" >/dev/null 2>&1 || true; wait $UP 2>/dev/null || true; rm -f "$OUT"' EXIT
for _ in $(seq 100); do grep -qx ready "$OUT" && break; sleep 0.1; done
grep -qx ready "$OUT" || { cat "$OUT"; echo "wan-emu-ping: emulator did not come up" >&2; exit 1; }
grep '^peer ' "$OUT"
ip netns exec "moesh-$NAME-hub" ping -c 3 10.77.1.2 | tail -1 | sed 's/^/hub -> a (40 ms each way): /'
ip netns exec "moesh-$NAME-hub" ping -c 3 10.77.2.2 | tail -1 | sed 's/^/hub -> b (10 ms each way): /'
ip netns exec "moesh-$NAME-a" ping -c 3 10.77.2.2 | tail -1 | sed 's/^/a -> b (via the hub):      /'
"$MOESH" wan-emu down --name "$NAME"
wait $UP
left="$(ip netns list | grep -c "^moesh-$NAME-" || true)"
echo "namespaces left: $left"
[ "$left" = 0 ]
