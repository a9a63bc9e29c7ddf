"""Where each clock request comes from and how it goes out: the plan or policy file, the step sources (a
replayed schedule, or the online policy deciding inside each step), the controller's thread that runs them
(the issuer), the actuator, and the online policy's live clocks, warm-up and decision records."""
