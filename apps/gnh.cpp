// SPDX-License-Identifier: BSD-3-Clause
// gnh: initialise MPI and Kokkos, hand the command line to the subcommands
// (driver/command.hpp), report. User errors (gnh::Error) end every rank with
// status 1 and one message, never an MPI abort; the only place they are caught
// is here.
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "analysis/usage.hpp"
#include "core/error.hpp"
#include "driver/command.hpp"
#include "parallel/comm.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  {
    gnh::Comm comm(MPI_COMM_WORLD);
    // Kokkos sees only the --kokkos-* arguments: given --help it would print
    // its own banner instead of gnh's. gnh's parser sees the rest;
    // --kokkos-help prints Kokkos' options and nothing else.
    std::vector<char*> kokkos_argv{argv[0]}, gnh_argv{argv[0]};
    bool kokkos_help = false;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a.rfind("--kokkos-", 0) == 0) {
        kokkos_argv.push_back(argv[i]);
        kokkos_help = kokkos_help || a == "--kokkos-help";
      } else {
        gnh_argv.push_back(argv[i]);
      }
    }
    int kokkos_argc = int(kokkos_argv.size()), gnh_argc = int(gnh_argv.size());
    kokkos_argv.push_back(nullptr);
    gnh_argv.push_back(nullptr);
    Kokkos::initialize(kokkos_argc, kokkos_argv.data());
    gnh::watch_allocations();  // each stage's allocated high-water mark, beside the plan
    try {
      if (!kokkos_help) status = gnh::run_gnh(gnh_argc, gnh_argv.data(), comm);
    } catch (const gnh::ErrorElsewhere&) {
      status = 1;
    } catch (const gnh::Error& e) {
      std::fprintf(stderr, "gnh: error: %s\n", e.what());
      status = 1;
    } catch (const std::exception& e) {
      // Not a user error: a bug. Other ranks may be waiting in a collective,
      // so abort the job rather than hang it.
      std::fprintf(stderr, "gnh: internal error on rank %d: %s\n", comm.rank(), e.what());
      if (comm.size() > 1) MPI_Abort(MPI_COMM_WORLD, 3);
      status = 3;
    }
    Kokkos::finalize();
  }
  MPI_Finalize();
  return status;
}
