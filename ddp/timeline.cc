// timeline.cc: see timeline.h. The Chrome trace event format: a JSON object with
// "traceEvents": complete events ("ph": "X", ts + dur in microseconds), instants
// ("ph": "i") and metadata ("ph": "M") naming the lanes.
#include "ddp/timeline.h"

#include <map>

#include <nlohmann/json.hpp>

#include "tensor/safetensors.h"

namespace ringtrain::ddp {

void write_chrome_trace(const std::string& path, const Reducer& reducer, double forward_ms, int rank) {
  // StepStats::backward_ms is set at the end of a synced backward and reset to 0 when the
  // next one is prepared (a synced forward); 0 also before the first. The picture would
  // then be a backward of no length, the hooks of a step that never finished and no
  // buckets: refuse it rather than write a trace that looks like a real step.
  const StepStats& stats = reducer.last_stats();
  RT_CHECK(stats.backward_ms > 0, "write_chrome_trace: the reducer has no finished synced step to draw (no "
           "backward has finished since the last synced forward: it failed, or has not run yet); call it "
           "right after a backward that returned, before the next forward");
  enum Lane { kCompute = 1, kGrads = 2, kComm = 3 };
  nlohmann::json events = nlohmann::json::array();
  auto lane_name = [&](int tid, const char* name) {
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", rank}, {"tid", tid}, {"args", {{"name", name}}}});
  };
  lane_name(kCompute, "compute");
  lane_name(kGrads, "gradient ready");
  lane_name(kComm, "comm (bucket allreduce)");
  events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", rank}, {"args", {{"name", "rank " + std::to_string(rank)}}}});
  // Times in the reducer are relative to the end of forward; shift by forward_ms.
  auto us = [&](double ms_after_forward) { return (forward_ms + ms_after_forward) * 1000.0; };
  auto span = [&](int tid, const std::string& name, double begin_us, double end_us, nlohmann::json args = {}) {
    nlohmann::json e = {{"ph", "X"}, {"name", name}, {"pid", rank}, {"tid", tid}, {"ts", begin_us},
                        {"dur", std::max(0.0, end_us - begin_us)}};
    if (!args.is_null()) e["args"] = std::move(args);
    events.push_back(std::move(e));
  };
  span(kCompute, "forward", 0, forward_ms * 1000.0);
  span(kCompute, "backward", us(0), us(stats.backward_compute_ms));
  span(kCompute, "finalize: wait for allreduces", us(stats.backward_compute_ms), us(stats.backward_ms));
  for (const auto& [index, ms] : reducer.last_grad_ready_times())
    events.push_back({{"ph", "i"}, {"s", "t"}, {"name", "grad " + reducer.parameter_name(index)}, {"pid", rank},
                      {"tid", kGrads}, {"ts", us(ms)}});
  // Buckets launch strictly in index order, so bucket b waited for its turn only when
  // bucket b - 1 was launched after b became ready (launch and ready are two clock
  // readings, so launch > ready alone holds for every bucket).
  std::map<size_t, double> launch_ms_of;
  for (const auto& t : reducer.last_bucket_timings()) launch_ms_of[t.bucket] = t.launch_ms;
  for (const auto& t : reducer.last_bucket_timings()) {
    std::string bucket = "bucket " + std::to_string(t.bucket);
    auto previous = t.bucket > 0 ? launch_ms_of.find(t.bucket - 1) : launch_ms_of.end();
    if (previous != launch_ms_of.end() && previous->second > t.ready_ms)
      span(kComm, bucket + ": waiting for its turn", us(t.ready_ms), us(t.launch_ms));
    span(kComm, "allreduce " + bucket, us(t.launch_ms), us(t.done_ms),
         {{"bytes", t.bytes}, {"MiB", static_cast<double>(t.bytes) / (1 << 20)}});
  }
  write_file_atomically(path, nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump(1));
}

}  // namespace ringtrain::ddp
