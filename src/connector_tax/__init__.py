"""connector-tax: measure what a KV connector costs vLLM (the substrate tax)."""

__version__ = "0.1.0"
