// mkernel — many simulations at once. Every prediction forks its own simulating process (SimGrid allows one engine
// per process), so the threads here only wait on children: N threads keep N simulations running.
#pragma once

#include <cstddef>
#include <functional>

namespace mk {

/// Run work(k) for every k in [0, n) on up to `jobs` threads (at least one; one in AddressSanitizer builds, where a
/// fork beside an allocating thread can hang the child), each taking the next k. The first exception stops the
/// threads from taking more work and is rethrown here once all have returned.
void forEachParallel(std::size_t n, unsigned jobs, const std::function<void(std::size_t)>& work);

}  // namespace mk
