"""Commands that need no GPU: bundled and captured traces, GPU profiles, the cost model, plans, learned policies
and the demo (``kdvfs demo | trace | gpus | model | predict | compare | plan | train | evaluate | policy``)."""
