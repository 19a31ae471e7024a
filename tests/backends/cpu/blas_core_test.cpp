#include "backends/cpu/blas_core.h"
#include <gtest/gtest.h>
#include <cstdlib>

namespace tandem::cpu {
namespace {

BlasCoreFacts facts(std::string loaded, VectorClass cpu, bool dynamic = true,
                    bool requested = false) {
  BlasCoreFacts f;
  f.loaded_core = std::move(loaded);
  f.cpu = cpu;
  f.dynamic_arch = dynamic;
  f.core_requested = requested;
  return f;
}

TEST(BlasCoreTest, NamesTheClassOfEachKernelSet) {
  for (const char* core : {"SkylakeX", "SKYLAKEX", "Cooperlake", "SapphireRapids"})
    EXPECT_EQ(coreClass(core), VectorClass::kAvx512) << core;
  for (const char* core : {"Haswell", "Zen"}) EXPECT_EQ(coreClass(core), VectorClass::kAvx2);
  for (const char* core : {"Sandybridge", "Bulldozer", "Excavator"})
    EXPECT_EQ(coreClass(core), VectorClass::kAvx) << core;
  for (const char* core : {"Prescott", "Core2", "Nehalem", "Barcelona", "unknown", ""})
    EXPECT_EQ(coreClass(core), VectorClass::kSse) << core;
}

// A CPU that OpenBLAS did not recognise gets narrower kernels than it runs (the H200
// host's Xeon: Prescott on an AVX-512 CPU); the set for the CPU's class is asked for.
TEST(BlasCoreTest, AsksForTheSetOfTheCpusClassWhereTheLoadedOneIsNarrower) {
  EXPECT_EQ(fasterBlasCore(facts("Prescott", VectorClass::kAvx512)), "SKYLAKEX");
  EXPECT_EQ(fasterBlasCore(facts("Haswell", VectorClass::kAvx512)), "SKYLAKEX");
  EXPECT_EQ(fasterBlasCore(facts("Zen", VectorClass::kAvx512)), "SKYLAKEX");
  EXPECT_EQ(fasterBlasCore(facts("Prescott", VectorClass::kAvx2)), "HASWELL");
  EXPECT_EQ(fasterBlasCore(facts("Sandybridge", VectorClass::kAvx2)), "HASWELL");
  EXPECT_EQ(fasterBlasCore(facts("Nehalem", VectorClass::kAvx)), "SANDYBRIDGE");
}

TEST(BlasCoreTest, KeepsTheLoadedSetWhereNothingIsGained) {
  // As wide as the CPU, or wider than a test's stated class: never a step down.
  EXPECT_EQ(fasterBlasCore(facts("Cooperlake", VectorClass::kAvx512)), "");
  EXPECT_EQ(fasterBlasCore(facts("Zen", VectorClass::kAvx2)), "");
  EXPECT_EQ(fasterBlasCore(facts("SkylakeX", VectorClass::kAvx2)), "");
  EXPECT_EQ(fasterBlasCore(facts("Prescott", VectorClass::kSse)), "");
  // A library built for one set cannot switch: a restart would change nothing.
  EXPECT_EQ(fasterBlasCore(facts("Prescott", VectorClass::kAvx512, false)), "");
  // Someone (a user, an earlier restart) named a set: kept, and never a second restart.
  EXPECT_EQ(fasterBlasCore(facts("Prescott", VectorClass::kAvx512, true, true)), "");
}

// This binary starts as every program of tandem's does (tests/test_main.cpp): unless a set
// was named before it started, it runs a set as wide as the CPU.
TEST(BlasCoreTest, ThisProcessRunsASetAsWideAsTheCpuUnlessOneWasNamed) {
  const BlasCoreFacts now = blasCoreFacts();
  EXPECT_EQ(now.loaded_core, blasCoreName());
  const char* named = std::getenv("OPENBLAS_CORETYPE");
  if (named == nullptr) {
    EXPECT_EQ(fasterBlasCore(now), "") << now.loaded_core;
  } else if (fasterBlasCore(facts(now.loaded_core, now.cpu, now.dynamic_arch)) != "") {
    // Narrower than the CPU: only because a set was named, not by the restart.
    EXPECT_NE(coreClass(named), now.cpu) << named << " loaded " << now.loaded_core;
  }
}

}  // namespace
}  // namespace tandem::cpu
