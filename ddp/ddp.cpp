// SPDX-License-Identifier: MIT
// Compile-time checks of the DDP layout constants (the layer itself is header-only).
#include "ddp/header.hpp"
#include "ddp/reassembly.hpp"
#include "ddp/segment.hpp"

namespace softrdma::ddp {

static_assert(ctrl_tagged(0xC140) && ctrl_last(0xC140) && ctrl_ddp_version(0xC140) == 1);
static_assert(!ctrl_tagged(0x4143) && ctrl_last(0x4143));
static_assert(SegmentPlan(0, 100).count() == 1 && SegmentPlan(0, 100).at(0) == Segment{0, 0, true});
static_assert(SegmentPlan(201, 100).count() == 3 && SegmentPlan(201, 100).at(2) == Segment{200, 1, true});
static_assert(SegmentPlan(200, 100).from(100) == Segment{100, 100, true});

}  // namespace softrdma::ddp
