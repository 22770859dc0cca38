// Prometheus text exposition (format 0.0.4) of the node's state: requests, queue depth,
// batch size, TTFT/TPOT percentiles per SLA class, acceptance and K per drafter and domain,
// KV bytes per precision class (the scheduler's gauges), preemptions and errors by code.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "coordinator/scheduler.h"
#include "coordinator/spec_controller.h"

namespace specnode {

// controllers: (drafter name, its controller), may be empty.
std::string PrometheusText(
    const SchedulerSnapshot& s,
    const std::vector<std::pair<std::string, const SpecController*>>& controllers);

// The p-quantile (0..1) of samples by nearest rank; 0 for no samples.
double Quantile(std::vector<double> samples, double p);

}  // namespace specnode
