"""How each server variant's server starts, per backend (sim, vllm, openai)."""
