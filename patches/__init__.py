"""Code that runs inside vLLM processes: the step-timing instrumentation (see README.md).

Imports nothing from connector_tax; importable as `patches.step_timing` with the repository
root on PYTHONPATH.
"""
