#!/usr/bin/env bash
# Pre-flight check of a risky variant (docs/study-design.md, "Pre-flight"):
# Mooncake kv_consumer configurations: start tools/dummy_bootstrap.py, launch the consumer,
# /v1/models must list the model, one request (max_tokens=4, no kv_transfer_params) must
# return 200 within 30 s, then /health 200 and the process alive.
#
#   verify_kv_consumer.sh CONFIG OUT_DIR [--port PORT] [--only NAME] [--start-timeout SECONDS] [--run ID]
#
# Writes OUT_DIR/verify_<config>.log and the config's entry of OUT_DIR/preflight_status.json
# ({"status": "ok"|"skip", "reason": ...}). See tools/README.md.
set -euo pipefail
# shellcheck source=tools/_verify_lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/_verify_lib.sh"
verify_main kv_consumer "$@"
