"""The core layer: pure torch functions over tensors (objectives, log-probs, batching); imports nothing above it."""
