"""The simulated vLLM server: a leaf (engine, API, KV cache, costs, faults, runner); see README.md."""
