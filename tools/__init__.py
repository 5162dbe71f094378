"""Things vLLM or a person runs directly: the NoOpConnector, the dummy Mooncake bootstrap, the
pre-flight verify scripts and the GPU smoke test (see README.md).

Imports nothing from connector_tax; importable as `tools.<module>` with the repository root on
PYTHONPATH (vLLM loads `tools.noop_connector` that way).
"""
