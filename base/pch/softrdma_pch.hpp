// Precompiled for every C++ source of libsoftrdma (meson cpp_pch): third-party and standard headers only, so
// no layer sees another through it. Parsing DPDK's, Boost.Lockfree's and the standard library's headers was
// about half of each source's compile time.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <boost/lockfree/spsc_queue.hpp>
#include <rte_cycles.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>
