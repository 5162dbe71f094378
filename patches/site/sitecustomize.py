"""Loads the connector-tax step-timing instrumentation into every Python process that has
this folder on PYTHONPATH (the `vllm serve` API server, its engine core and its workers), and
the interventions the variant declared (patches/interventions/: the Mooncake CPU guard, NIXL's
progress thread off or slowed), named by the launch in $CONNECTOR_TAX_INTERVENTIONS.

Python imports `sitecustomize` at start-up from the first folder on sys.path that has one;
the launch puts `<repo>` and `<repo>/patches/site` on PYTHONPATH. Without
$CONNECTOR_TAX_STEP_LOG and $CONNECTOR_TAX_INTERVENTIONS this does nothing but hand over to the
next sitecustomize on sys.path (an environment's own, if it has one), so a launch without them
behaves as plain vLLM.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _connector_tax_install() -> None:
    if not os.environ.get("CONNECTOR_TAX_STEP_LOG"):
        return
    try:
        from patches import step_timing

        step_timing.install()
    except Exception as exc:  # never stop vLLM from starting
        sys.stderr.write(f"connector-tax: step timing not installed: {exc!r}\n")


def _connector_tax_interventions() -> None:
    if not os.environ.get("CONNECTOR_TAX_INTERVENTIONS"):
        return
    try:
        from patches import interventions

        interventions.install()
    except Exception as exc:  # never stop vLLM from starting
        sys.stderr.write(f"connector-tax: interventions not installed: {exc!r}\n")


def _chain_next_sitecustomize() -> None:
    """Run the sitecustomize this file shadows, if any."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or spec.origin == __file__:
        return
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.stderr.write(f"connector-tax: the shadowed sitecustomize failed: {exc!r}\n")


_connector_tax_install()
_connector_tax_interventions()
_chain_next_sitecustomize()
