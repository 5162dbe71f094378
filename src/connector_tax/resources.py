"""Where the project's files that are not modules of this package live, found one way for every
reader: the workflow (Snakefile, rules, schema, report captions and profiles), the shipped
configs, and the code that vLLM imports by dotted path from outside the package (tools/,
patches/).

In a checkout (an editable install, the tests, CI) they are the checkout's own. A built wheel
(`pip install .`) carries a copy of them in connector_tax/_bundle/ (setup.py), so an installed
package runs `ctax sim`, checks configs and analyses results with no checkout at hand.
$CONNECTOR_TAX_ROOT names another checkout to use instead.
"""

from __future__ import annotations

import os
from pathlib import Path

# What a root must hold to be one (the checkout's top level, or the wheel's bundle).
_MARKERS = ("workflow/schemas/config.schema.yaml", "tools/noop_connector.py", "patches/step_timing.py")
BUNDLED = ("Snakefile", "workflow", "configs", "tools", "patches")  # copied into a wheel's bundle
_PACKAGE = Path(__file__).resolve().parent


def _is_root(path: Path) -> bool:
    return all((path / marker).is_file() for marker in _MARKERS)


def root() -> Path:
    """The folder holding workflow/, configs/, tools/ and patches/; ValueError if none does."""
    candidates = [Path(os.environ["CONNECTOR_TAX_ROOT"])] if os.environ.get("CONNECTOR_TAX_ROOT") else []
    candidates += [_PACKAGE.parents[1], _PACKAGE / "_bundle"]  # src/connector_tax -> the checkout
    for candidate in candidates:
        if _is_root(candidate):
            return candidate.resolve()
    raise ValueError(
        "CONNECTOR_TAX_ROOT: cannot find the project's workflow, configs, tools and patches (neither a "
        "checkout nor a built package's bundle); set CONNECTOR_TAX_ROOT to a connector-tax checkout"
    )


def path(relative: str) -> Path:
    """A project file by its path in the checkout, e.g. path("workflow/schemas/config.schema.yaml")."""
    return root() / relative


def is_checkout() -> bool:
    """Whether the root is a git checkout (it has a history to name) rather than a bundle."""
    return (root() / ".git").exists()


def workdir() -> Path:
    """What relative paths of a config (a local model under results/models/, caches) are relative
    to: the checkout, or for an installed package the current directory (never its bundle)."""
    return root() if is_checkout() else Path.cwd()
