"""The cost model and what runs on it: time, power and energy of a kernel at a clock pair, cost tables of a
trace under the power limit it was recorded under or another, schedules executed with switching latency, the
segment DP for latency-aware plans, and the estimation of kernel features (utilisations) from op shapes when no
profiler counters exist."""
