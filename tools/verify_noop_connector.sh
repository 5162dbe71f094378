#!/usr/bin/env bash
# Pre-flight check of a risky variant (docs/study-design.md, "Pre-flight"):
# NoOpConnector (and custom module-path) configurations: launch with the connector loaded
# through kv_connector_module_path, 5 sequential requests (max_tokens=32) must return 200
# within 30 s, then /health 200 and the process alive.
#
#   verify_noop_connector.sh CONFIG OUT_DIR [--port PORT] [--only NAME] [--start-timeout SECONDS] [--run ID]
#
# Writes OUT_DIR/verify_<config>.log and the config's entry of OUT_DIR/preflight_status.json
# ({"status": "ok"|"skip", "reason": ...}). See tools/README.md.
set -euo pipefail
# shellcheck source=tools/_verify_lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/_verify_lib.sh"
verify_main noop_connector "$@"
