"""The environment variable that names a server's step log, defined once for the package.

The simulator (connector_tax.sim) writes its step log where it says, the vLLM launch
(connector_tax.launch.vllm) sets it for vLLM's processes, and the instrumentation in patches/
reads it there. patches/ may not import this package, so it keeps its own copy of the name
(patches/targets.py) and tests/test_patches_step_timing.py checks the two are equal.
"""

STEP_LOG_ENV = "CONNECTOR_TAX_STEP_LOG"
