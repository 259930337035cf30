# Shared by bench/wan/*.sh (sourced): paths, the narrow benchmark model, the emulator and the
# workers. Source it, then `wan_init NAME "$@"`; sets $root $build $out $moesh $model $logs
# $emu_pid and (wan_workers) $worker_args.

# wan_init NAME [BUILD_DIR] [OUT_DIR]: paths, root and binary checks, the model, a log dir, and a
# trap that tears the workers and the emulator NAME down on exit.
wan_init() {
  wan_name="$1"
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
  build="$(cd "${2:-$root/build}" && pwd)"
  out="${3:-$root/docs/perf}"
  moesh="$build/bin/moesh"
  model="${MODEL:-${TMPDIR:-/tmp}/moesh-wan-bench.gguf}"
  [ "$(id -u)" -eq 0 ] || { echo "$(basename "$0"): needs root (network namespaces)" >&2; exit 1; }
  [ -x "$moesh" ] || { echo "$(basename "$0"): $moesh not built" >&2; exit 1; }
  mkdir -p "$out"
  wan_make_model
  logs="$(mktemp -d)"
  emu_pid=""
  trap 'wan_down; "$moesh" wan-emu down --name "$wan_name" >/dev/null 2>&1 || true; rm -rf "$logs"' EXIT
}

# The narrow model every WAN benchmark uses (only the trip structure matters): qwen3moe,
# 4 layers, 1024 wide, 32 experts top-4, Q8_0.
wan_make_model() {
  [ -f "$model" ] && return 0
  "$moesh" make-model --arch qwen3moe --type q8_0 --vocab none --out "$model" --n-embd 1024 --n-layer 4 \
    --n-head 16 --n-head-kv 4 --head-dim 64 --n-expert 32 --n-expert-used 4 --n-ff-exp 512 --n-vocab 2048 \
    --n-ctx 512 >/dev/null
}

# wan_up NAME --peer SPEC ...: starts `moesh wan-emu up` and waits for its "ready".
wan_up() {
  local name="$1"; shift
  "$moesh" wan-emu up --name "$name" "$@" >"$logs/emu" 2>&1 &
  emu_pid=$!
  for _ in $(seq 1 100); do grep -q '^ready' "$logs/emu" && break; sleep 0.1; done
  grep -q '^ready' "$logs/emu" || { cat "$logs/emu" >&2; exit 1; }
}

# wan_workers NAME W N_EXPERT: W workers in peers 1..W splitting every layer's experts evenly;
# their --worker arguments go to $worker_args.
wan_workers() {
  local name="$1" w="$2" n_expert="$3" per first last ns addr port i
  worker_args=()
  per=$((n_expert / w))
  for i in $(seq 1 "$w"); do
    first=$(( (i - 1) * per )); last=$(( i * per - 1 ))
    ns="moesh-$name-p$i"; addr="10.77.$i.2"
    ip netns exec "$ns" "$moesh" worker -m "$model" --experts "*:$first-$last" --listen "$addr:0" -t 1 \
      >"$logs/w$i" 2>&1 &
    for _ in $(seq 1 100); do grep -aq 'listening on' "$logs/w$i" && break; sleep 0.1; done
    port=$(grep -ao 'listening on [0-9.]*:[0-9]*' "$logs/w$i" | sed 's/.*://')
    worker_args+=(--worker "$addr:$port")
  done
}

# wan_down NAME: stops the workers and the emulator of one configuration.
wan_down() {
  pkill -f "moesh worker -m $model" 2>/dev/null || true
  if [ -n "$emu_pid" ]; then kill "$emu_pid"; wait "$emu_pid" 2>/dev/null || true; fi
  emu_pid=""
}
