# Cross-compiling for 32-bit ARM boards (Raspberry Pi 2/3/4 with Raspberry Pi OS 32-bit:
# armhf) with Debian's cross compiler (crossbuild-essential-armhf) against the multiarch
# libraries under /usr/lib/arm-linux-gnueabihf (scripts/setup --preset armhf installs
# them). Tests built this way run under qemu-user.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR armv7l)
set(CMAKE_CXX_COMPILER arm-linux-gnueabihf-g++)
set(CMAKE_LIBRARY_ARCHITECTURE arm-linux-gnueabihf)
# ARMv7-A, hard float, NEON (every Pi from the 2 on). GCC does not vectorise floats with
# ARMv7 NEON (it flushes denormals), so float results stay IEEE's, as on the other targets.
# -Wno-psabi: GCC notes that passing some structs changed ABI in GCC 7.1, which concerns
# nothing built with one compiler.
set(CMAKE_CXX_FLAGS_INIT "-march=armv7-a -mfpu=neon-vfpv4 -mfloat-abi=hard -Wno-psabi")
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-arm)
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/arm-linux-gnueabihf/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
