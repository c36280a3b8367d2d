// Precompiled for every C++ source of libsoftrdma (meson cpp_pch): third-party and standard headers only, so
// no layer sees another of ours through it. Parsing DPDK's, Boost.Lockfree's and the standard library's headers
// was about half of each source's compile time. It lives in io/, the lowest folder the layer picture lets
// include DPDK (tests/layout/check_layers.py); the protocol layers are in softrdma_proto, built without it.
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
