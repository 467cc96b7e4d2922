"""The run's safety: the run directory and its file names, the lock, checkpoints, the lifecycle of
`train()`, preemption, the non-finite guards, the completions log and the resumable run state."""
