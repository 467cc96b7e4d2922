"""Where a training rollout comes from: our sampler (one turn or the tool loop), overlapped
scoring, tool setup, the built-in python tool, and streamed datasets."""
