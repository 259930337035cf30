#!/usr/bin/env bash
# Installs what the aarch64 cross build (`make cross-aarch64`) and its qemu tests need on a Debian 12
# x86-64 machine: Debian's cross compiler, qemu-user, and the arm64 (multiarch) variants of the
# libraries scripts/install-deps.sh installs for the build. Header-only packages that are
# architecture-independent (CLI11, nlohmann-json, asio) come from install-deps.sh and serve both.
# Idempotent: adds the arm64 architecture once, installs only what is missing (apt-get only).
set -euo pipefail

PKGS=(
  g++-aarch64-linux-gnu qemu-user
  libfmt-dev:arm64 libspdlog-dev:arm64 libssl-dev:arm64 libboost-dev:arm64
  libxxhash-dev:arm64 libpcre2-dev:arm64 libcpp-httplib-dev:arm64
  libgtest-dev:arm64 libgmock-dev:arm64
)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive

added_arch=0
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  echo "install-cross-aarch64: adding the arm64 architecture"
  $SUDO dpkg --add-architecture arm64
  added_arch=1
fi

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-cross-aarch64: all ${#PKGS[@]} packages present"
  exit 0
fi

echo "install-cross-aarch64: installing ${missing[*]}"
if [ "$added_arch" -eq 1 ] || [ ! -d /var/lib/apt/lists ] ||
  ! ls /var/lib/apt/lists/*_binary-arm64_Packages* >/dev/null 2>&1; then
  $SUDO apt-get update -qq
fi
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
