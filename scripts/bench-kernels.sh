#!/usr/bin/env bash
# Kernel benchmarks at MoE expert shapes, reported against this machine's measured memory
# bandwidth (same run). Builds bench_kernels, runs a filtered set (< 5 minutes on 2 cores) and
# prints a markdown table: weight GB/s per matvec/matmul and its fraction of the read bandwidth
# measured with the same thread count.
#
#   scripts/bench-kernels.sh [build-dir]
#   FILTER=<regex> MIN_TIME=<seconds> scripts/bench-kernels.sh      (override the selection)
#   MOESH_ISA=scalar|avx2|avx512 scripts/bench-kernels.sh           (force a kernel table)
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build-bench}"
min_time="${MIN_TIME:-0.3}"
# Expert shapes n_embd in {2048, 7168} x ffn in {768, 2048}: gate/up (K=n_embd, M=ffn) and
# down (K=ffn, M=n_embd); all types, batches 1/8/64, 1 and 2 threads.
filter="${FILTER:-kern/.*/(gate/K(2048|7168)xM(768|2048)|down/K(768|2048)xM(2048|7168))/b(1|8|64)/t(1|2)/}"

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DMOESH_BUILD_BENCH=ON >/dev/null
cmake --build "$build" --target bench_kernels -j2 >/dev/null

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
commit="$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
if ! git -C "$root" diff --quiet HEAD 2>/dev/null; then commit="$commit+dirty"; fi
export MOESH_GIT_COMMIT="$commit"

bin="$build/bin/bench_kernels"
echo "# bench_kernels: commit $commit, $(date -u +%Y-%m-%dT%H:%MZ), load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cpus"

# Runs the binary quietly; its stderr (context line, any MISMATCH abort) shows only on failure.
run() {
  local json="$1"; shift
  if ! "$bin" "$@" --benchmark_out="$out/$json" --benchmark_out_format=json >/dev/null 2>"$out/err"; then
    cat "$out/err" >&2
    echo "bench_kernels failed ($json)" >&2
    exit 1
  fi
}
# Bandwidth before and after the kernels (the machine drifts); pool wake cost with and without
# the spin.
run mem1.json --benchmark_filter='^mem/' --benchmark_min_time=1 --benchmark_repetitions=3
run kern.json --benchmark_filter="$filter" --benchmark_min_time="$min_time"
run mem2.json --benchmark_filter='^mem/' --benchmark_min_time=1 --benchmark_repetitions=3
run pool_spin.json --benchmark_filter='^pool/' --benchmark_min_time=0.5
MOESH_POOL_SPIN_US=0 run pool_nospin.json --benchmark_filter='^pool/' --benchmark_min_time=0.5

python3 - "$out" <<'EOF'
import json, sys, re, statistics
d = sys.argv[1]
def load(name):
    with open(f"{d}/{name}") as f:
        return json.load(f)
kern = load("kern.json")
ctx = kern["context"]
print(f"# isa: {ctx.get('moesh_isa')}, cpu: {ctx.get('cpu_model')}, commit: {ctx.get('moesh_commit')}")

# Measured read bandwidth per thread count: the median of all repetitions before and after.
UNIT = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
def gbs(b, key):  # weight bytes per second from wall ("real_time") or CPU ("cpu_time") time
    return b["bytes"] / (b[key] * UNIT[b["time_unit"]]) / 1e9

# Measured read bandwidth per thread count: the median of all repetitions before and after.
bw = {"real_time": {}, "cpu_time": {}}
for name in ("mem1.json", "mem2.json"):
    for b in load(name)["benchmarks"]:
        if b.get("run_type") == "aggregate":
            continue
        t = int(re.search(r"/t(\d+)", b["name"]).group(1))
        for key in bw:
            bw[key].setdefault(t, []).append(gbs(b, key))
bwm = {key: {t: statistics.median(v) for t, v in d.items()} for key, d in bw.items()}
print()
print("Measured read bandwidth (1 GiB read-sum, median of 6 runs around the kernels): " +
      ", ".join(f"{t} thread{'s' if t > 1 else ''}: {bwm['real_time'][t]:.1f} GB/s "
                f"(range {min(v):.1f}-{max(v):.1f})" for t, v in sorted(bw["real_time"].items())))
print("Per CPU second of the calling thread (what a dedicated core would see when the machine is "
      "shared): " + ", ".join(f"{t} thread{'s' if t > 1 else ''}: {bwm['cpu_time'][t]:.1f} GB/s"
                              for t in sorted(bwm["cpu_time"])))
print()
print("wall = per wall-clock second; cpu = per CPU second of the calling thread. % BW compares "
      "with the read bandwidth measured the same way and with the same thread count.")
print()
print("| type | proj | K x M | batch | threads | wall us | GB/s wall | % BW wall | GB/s cpu | % BW cpu | GFLOP/s wall | GFLOP/s cpu |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
rows = []
for b in kern["benchmarks"]:
    m = re.match(r"kern/([^/]+)/([^/]+)/K(\d+)xM(\d+)/b(\d+)/t(\d+)", b["name"])
    if not m:
        continue
    typ, proj, k, mm, batch, th = m.groups()
    th = int(th); batch = int(batch)
    gw, gc = gbs(b, "real_time"), gbs(b, "cpu_time")
    fw, fc = 100.0 * gw / bwm["real_time"][th], 100.0 * gc / bwm["cpu_time"][th]
    rows.append((typ, proj, int(k), int(mm), batch, th, fw, fc))
    print(f"| {typ} | {proj} | {k} x {mm} | {batch} | {th} | {b['real_time']:.1f} | {gw:.2f} | {fw:.0f}% "
          f"| {gc:.2f} | {fc:.0f}% | {b['FLOPS']/1e9:.1f} | {b['FLOPS']/1e9 * gc / gw:.1f} |")

print()
print("Matvec (batch 1) summary, mean fraction of measured bandwidth over the shapes above:")
print()
print("| type | 1 thread wall | 2 threads wall | 1 thread cpu | 2 threads cpu |")
print("|---|---:|---:|---:|---:|")
for typ in sorted({r[0] for r in rows}):
    cells = []
    for idx in (6, 7):
        for th in (1, 2):
            v = [r[idx] for r in rows if r[0] == typ and r[4] == 1 and r[5] == th]
            cells.append(f"{statistics.mean(v):.0f}%" if v else "-")
    print(f"| {typ} | {cells[0]} | {cells[1]} | {cells[2]} | {cells[3]} |")

def pool_ns(name):
    b = [x for x in load(name)["benchmarks"] if x["name"].startswith("pool/")][0]
    return b["real_time"] * {"ns": 1, "us": 1e3, "ms": 1e6}[b["time_unit"]]
print()
print(f"Thread pool, one empty 2-thread parallel_for: {pool_ns('pool_spin.json')/1e3:.2f} us with the "
      f"default spin, {pool_ns('pool_nospin.json')/1e3:.2f} us with MOESH_POOL_SPIN_US=0.")
print()
print("llama.cpp reference (../shared/perf/README.md, on its own machine): whole-model decode reads "
      "weights at ~6.9 GB/s (Q4_K_M) / ~7.6 GB/s (Q8_0) with 1 thread and ~13.0 / ~14.3 GB/s with "
      "2 threads, 43-51% of that machine's measured bandwidth (15.4 / 28.4 GB/s).")
EOF
