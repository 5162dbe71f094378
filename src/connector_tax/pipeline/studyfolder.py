"""One study folder holds one study on one backend.

`results/<study>/study.json` records the study name and backend of the first run that wrote
there. A later run of the same study name on another backend (a simulated run of the real
study's config, say) is refused before anything starts: its cells would otherwise be measured
into the same folders as, and compared with, results of a different kind.
"""

from __future__ import annotations

import json
from typing import Any

from connector_tax.atomic import write_json
from connector_tax.config import ConfigError
from connector_tax.contract import StudyLayout


def check_study_folder(config: dict[str, Any]) -> None:
    """Raise ConfigError (one line) if results/<study> holds another backend's results."""
    layout = StudyLayout.of(config["study"])
    try:
        stamp = json.loads(layout.stamp.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if stamp.get("backend") != config["backend"]:
        raise ConfigError(
            "backend",
            f"{layout.root} holds backend {stamp.get('backend')} results and this run is backend "
            f"{config['backend']}: give it its own study name (e.g. --config study={config['study']}-{config['backend']})",
        )


def stamp_study_folder(config: dict[str, Any]) -> None:
    layout = StudyLayout.of(config["study"])
    write_json(layout.stamp, {"study": config["study"], "backend": config["backend"]})
