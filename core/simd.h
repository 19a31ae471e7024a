// What the vectorised loops may use. On x86 some are compiled twice, for AVX2 and for the
// baseline, and the loader picks one (TANDEM_CLONES: GCC and clang's target_clones), or
// written with AVX2 intrinsics and chosen by hasAvx2(); elsewhere (ARM boards) the
// portable loops are all there is.
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#define TANDEM_X86 1
#define TANDEM_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define TANDEM_X86 0
#define TANDEM_CLONES
#endif

namespace tandem {

// Whether this CPU runs AVX2 (asked once); false off x86.
bool hasAvx2();

}  // namespace tandem
