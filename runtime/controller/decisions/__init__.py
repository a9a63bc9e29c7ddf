"""Where each clock request comes from and how it goes out: the step sources (a replayed schedule, or the
online policy deciding inside each step), the actuator, and the online policy's live clocks, warm-up and
decision records."""
