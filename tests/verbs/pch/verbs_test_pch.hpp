// Precompiled for every verbs_test source (meson cpp_pch): the fixture pulls in Catch2, DPDK, lwIP and Boost
// headers whose parsing was over half of each file's compile time.
#include "tests/verbs/fixture.hpp"
