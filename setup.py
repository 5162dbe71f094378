"""Build step pyproject.toml cannot express: a wheel carries a copy of the workflow, the configs
and the code vLLM imports by dotted path (tools/, patches/) in connector_tax/_bundle/, so that an
installed package finds them without a checkout (connector_tax/resources.py)."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
BUNDLED = ("Snakefile", "workflow", "configs", "tools", "patches")  # = connector_tax.resources.BUNDLED


class BuildWithBundle(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:  # an editable install reads the checkout itself
            return
        bundle = Path(self.build_lib) / "connector_tax" / "_bundle"
        shutil.rmtree(bundle, ignore_errors=True)
        for name in BUNDLED:
            source = HERE / name
            if source.is_dir():
                shutil.copytree(source, bundle / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                bundle.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, bundle / name)


setup(cmdclass={"build_py": BuildWithBundle})
