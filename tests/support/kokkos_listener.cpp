// SPDX-License-Identifier: BSD-3-Clause
// Starts Kokkos around the whole Catch2 run (linked into every test; the test
// main itself comes precompiled from Catch2WithMain).
#define CATCH_CONFIG_EXTERNAL_INTERFACES
#include <Kokkos_Core.hpp>
#include <catch2/catch.hpp>

namespace {
struct KokkosListener : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testRunStarting(Catch::TestRunInfo const&) override { Kokkos::initialize(); }
  void testRunEnded(Catch::TestRunStats const&) override { Kokkos::finalize(); }
};
}  // namespace
CATCH_REGISTER_LISTENER(KokkosListener)
