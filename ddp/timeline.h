// timeline.h: one DDP step as a Chrome trace (chrome://tracing, https://ui.perfetto.dev).
//
// defines: write_chrome_trace.
//
// Lanes (Chrome "threads") of the picture:
//   compute   forward, then backward until the last gradient hook, then the
//             finalize wait (blocked on collectives that did not hide);
//   grads     an instant per parameter when autograd finished its gradient —
//             the moments the Reducer hears about, in backward order;
//   comm      per bucket: "waiting for its turn" (complete but a lower-indexed
//             bucket is not yet launched) and the allreduce itself, from launch
//             to the completion time the communication thread stamped.
// Overlap is visible as comm spans lying under the backward span.
#pragma once

#include <string>

#include "ddp/reducer.h"

namespace ringtrain::ddp {

// Writes the reducer's last synced step; `forward_ms` is drawn before backward. Call it
// after a backward that returned and before the next forward: otherwise (the backward
// threw, or a synced forward prepared the next one) it throws Error and writes nothing.
void write_chrome_trace(const std::string& path, const Reducer& reducer, double forward_ms, int rank);

}  // namespace ringtrain::ddp
