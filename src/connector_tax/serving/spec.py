"""What it takes to start one server: an argv list (never a shell string) and its environment."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field


@dataclass(frozen=True)
class LaunchSpec:
    argv: list[str]
    # Only the variables the launch sets or overrides; the caller's environment is inherited.
    env: dict[str, str] = field(default_factory=dict)
    # External servers (backend openai) are not launched: url says where they are.
    url: str | None = None

    def script(self) -> str:
        """A runnable launch.sh that reproduces this launch, every value shlex-quoted."""
        lines = ["#!/usr/bin/env bash", "set -euo pipefail"]
        lines += [f"export {name}={shlex.quote(value)}" for name, value in sorted(self.env.items())]
        if self.argv:
            lines.append("exec " + " ".join(shlex.quote(a) for a in self.argv))
        else:
            lines.append(f"# external server, not launched: {self.url}")
        return "\n".join(lines) + "\n"
