#!/usr/bin/env bash
# Pre-flight check of a risky variant (docs/study-design.md, "Pre-flight"):
# MultiConnector configurations (e.g. Mooncake kv_both + LMCacheConnectorV1): launch,
# 5 sequential requests (max_tokens=32, random content) must all complete within 60 s,
# then /health 200 and the process alive (vLLM 0.33 has no engine_core_failed_total).
#
#   verify_multi_connector.sh CONFIG OUT_DIR [--port PORT] [--only NAME] [--start-timeout SECONDS] [--run ID]
#
# Writes OUT_DIR/verify_<config>.log and the config's entry of OUT_DIR/preflight_status.json
# ({"status": "ok"|"skip", "reason": ...}). See tools/README.md.
set -euo pipefail
# shellcheck source=tools/_verify_lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/_verify_lib.sh"
verify_main multi_connector "$@"
