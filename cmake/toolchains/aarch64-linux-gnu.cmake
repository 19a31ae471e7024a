# Cross-compiling for 64-bit ARM boards (Raspberry Pi 4/5 with a 64-bit OS, Jetson) with
# Debian's cross compiler (crossbuild-essential-arm64) against the multiarch libraries
# under /usr/lib/aarch64-linux-gnu (`apt-get install libzmq3-dev:arm64 ...`; scripts/setup
# --preset aarch64 installs them). Tests built this way run under qemu-user.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# The baseline every aarch64 CPU runs (ARMv8-A: NEON and fp16 conversion included);
# nothing is tuned for the build machine.
set(CMAKE_CXX_FLAGS_INIT "-march=armv8-a")
# ctest and gtest_discover_tests run the ARM binaries through qemu; the multiarch
# loader and libraries are at their real paths, so qemu needs no sysroot.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64)
# pkg-config must read the arm64 .pc files, never the build machine's.
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")
# Programs (flatc) are the build machine's; libraries and packages the target's.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
