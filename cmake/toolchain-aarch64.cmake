# Cross build for aarch64 (64-bit ARM Linux: boards, servers, phones under Termux) on a Debian 12
# x86-64 machine with Debian's cross compiler and multiarch arm64 libraries
# (scripts/install-cross-aarch64.sh installs both; `make cross-aarch64` uses this file):
#   cmake -S . -B build-aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-aarch64.cmake
# Multiarch puts the arm64 libraries in /usr/lib/aarch64-linux-gnu beside the host's, so there is
# no sysroot: CMake's library architecture picks that folder, pkg-config is pointed at it, and the
# arch-independent packages (CLI11, nlohmann-json, asio headers) are shared with the host build.
# Tests run under qemu-user through CMAKE_CROSSCOMPILING_EMULATOR, so `ctest` in the cross build
# directory runs the aarch64 test binaries on this machine.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(MOESH_CROSS_TRIPLE aarch64-linux-gnu)
set(CMAKE_C_COMPILER ${MOESH_CROSS_TRIPLE}-gcc)
set(CMAKE_CXX_COMPILER ${MOESH_CROSS_TRIPLE}-g++)
set(CMAKE_LIBRARY_ARCHITECTURE ${MOESH_CROSS_TRIPLE})

# Only the arm64 .pc files (and arch-independent ones): never the host's x86-64 libraries.
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/${MOESH_CROSS_TRIPLE}/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")

# qemu-user runs the test binaries with the multiarch loader and libraries (libc6:arm64 in
# /lib/ld-linux-aarch64.so.1 and /usr/lib/aarch64-linux-gnu). Not `-L /usr/aarch64-linux-gnu`:
# that loader and libc come from libc6-arm64-cross, a different glibc build than libc6:arm64, and
# the mix hangs in the first pthread_create.
find_program(MOESH_QEMU_AARCH64 NAMES qemu-aarch64 qemu-aarch64-static)
if(MOESH_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${MOESH_QEMU_AARCH64})
endif()
