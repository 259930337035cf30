#!/usr/bin/env bash
# Installs exactly the Debian 12 packages moesh needs to build and test.
# Idempotent: only packages that are missing are installed (apt-get, no other source).
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev nlohmann-json3-dev libspdlog-dev libfmt-dev libxxhash-dev
  libasio-dev libpcre2-dev libcpp-httplib-dev libssl-dev libboost-dev
  clang-format clang libclang-rt-14-dev graphviz gnuplot-nox
  curl iproute2 openssl
  python3 python3-jinja2
  chromium
)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# Node.js + npm drive the OpenAI-client server tests; a machine that already has them (from any
# source) keeps its own, since Debian's npm conflicts with NodeSource's nodejs.
if ! command -v npm >/dev/null 2>&1; then missing+=(nodejs npm); fi

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
