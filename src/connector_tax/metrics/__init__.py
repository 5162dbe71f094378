"""Server-side metrics: the 1 Hz /metrics sampler."""
