"""The plan advisors: each plan budget's latency-aware plan of a step, where a request made now lands, and
where each plan's proposal changes (what the action chooses among)."""
