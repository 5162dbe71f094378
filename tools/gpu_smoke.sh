#!/usr/bin/env bash
# One-command GPU smoke test of the vLLM backend: every connector configuration of a study,
# served by a small model, must start, answer a few requests, stay alive, and fill its step log.
#
#   tools/gpu_smoke.sh [--config FILE] [--out DIR] [--model HF_ID] [--port PORT] [--gpu N]
#                      [--only NAME] [--mooncake-protocol tcp|rdma] [--start-timeout S] [--graphs]
#
# Defaults: configs/h20-qwen3-coder.yaml (all 10 of its variants), results/gpu_smoke,
# Qwen/Qwen3-0.6B, port 18200, GPU 0 (or the first of CUDA_VISIBLE_DEVICES), Mooncake over tcp
# (no RDMA needed), 900 s to start, eager mode (--enforce-eager: quick starts). --graphs runs the
# study's own mode instead, torch.compile and CUDA graphs (slower starts, what the study launches).
# Every launch runs on that one GPU, numbered in PCI order (CUDA_DEVICE_ORDER=PCI_BUS_ID, as the
# study's), and waits first until the previous server's memory is released (as the study's
# launches do: vLLM refuses to start below gpu_memory_utilization x total free).
# Needs a GPU host with vLLM 0.33 (`vllm` on PATH, or vllm.executable in the config), and
# Mooncake / NIXL / LMCache for their configurations: a configuration whose server fails to
# start because one of those packages is missing is reported SKIP, not FAIL.
#
# Per configuration, under OUT/<name>/: launch.sh, server.log, check.log, engine_step.*.jsonl
# and the instrumentation's targets report. OUT/gpu_smoke.json and the table printed at the
# end give PASS / SKIP / FAIL with the reason. Exit 0 when nothing FAILed.
set -euo pipefail
# shellcheck source=tools/_verify_lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/_verify_lib.sh"
VERIFY_PROG="gpu_smoke.sh"

repo="$(cd "$VERIFY_TOOLS/.." && pwd)"
base="$repo/configs/h20-qwen3-coder.yaml"
out="$repo/results/gpu_smoke"
model="Qwen/Qwen3-0.6B"
port=18200
only=""
protocol="tcp"
start_timeout=900
gpu="${CUDA_VISIBLE_DEVICES:-0}"
gpu="${gpu%%,*}"
eager=()

while [ $# -gt 0 ]; do
  case "$1" in
    --config) [ $# -ge 2 ] || verify_die "--config needs a file"; base="$2"; shift 2 ;;
    --out) [ $# -ge 2 ] || verify_die "--out needs a folder"; out="$2"; shift 2 ;;
    --model) [ $# -ge 2 ] || verify_die "--model needs a model id"; model="$2"; shift 2 ;;
    --port) [ $# -ge 2 ] || verify_die "--port needs a value"; port="$2"; shift 2 ;;
    --only) [ $# -ge 2 ] || verify_die "--only needs a config name"; only="$2"; shift 2 ;;
    --mooncake-protocol) [ $# -ge 2 ] || verify_die "--mooncake-protocol needs tcp or rdma"; protocol="$2"; shift 2 ;;
    --start-timeout) [ $# -ge 2 ] || verify_die "--start-timeout needs a value"; start_timeout="$2"; shift 2 ;;
    --gpu) [ $# -ge 2 ] || verify_die "--gpu needs a device index"; gpu="$2"; shift 2 ;;
    --graphs) eager=(--no-enforce-eager); shift ;;
    -h | --help) sed -n '2,24p' "$0"; exit 0 ;;
    *) verify_die "unknown argument: $1" ;;
  esac
done
[[ "$port" =~ ^[0-9]+$ ]] || verify_die "--port: '$port' is not a port number"
[[ "$start_timeout" =~ ^[0-9]+$ ]] || verify_die "--start-timeout: '$start_timeout' is not a number of seconds"
[[ "$gpu" =~ ^[0-9]+$ ]] || verify_die "--gpu: '$gpu' is not a device index"
export CUDA_VISIBLE_DEVICES="$gpu" CUDA_DEVICE_ORDER=PCI_BUS_ID
[ "$protocol" = tcp ] || [ "$protocol" = rdma ] || verify_die "--mooncake-protocol: '$protocol' is not tcp or rdma"
[ -f "$base" ] || verify_die "--config: $base: no such file"
mkdir -p "$out" || verify_die "--out: cannot create $out"

PY="$(verify_python)"
trap verify_cleanup EXIT
trap 'exit 130' INT TERM

config="$out/smoke.yaml"
"$PY" -m connector_tax.commands.for_tools smoke-config "$base" "$config" --model "$model" \
  --mooncake-protocol "$protocol" ${eager[@]+"${eager[@]}"} >/dev/null || exit 2
if [ -n "$only" ]; then
  names="$("$PY" -m connector_tax.commands.for_tools names "$config" | grep -Fx -- "$only" || true)"
  [ -n "$names" ] || verify_die "--only: no config named '$only' in $base"
else
  names="$("$PY" -m connector_tax.commands.for_tools names "$config")"
fi
summary="$out/gpu_smoke.json"
echo '{}' >"$summary"
mode=eager
[ ${#eager[@]} -eq 0 ] || mode="torch.compile and CUDA graphs"
echo "gpu_smoke: $model on GPU $gpu ($mode), configs of $base, results in $out"

record() { # name result reason step-timing-json
  "$PY" - "$summary" "$@" <<'EOF'
import json, sys
path, name, result, reason, timing = sys.argv[1:6]
data = json.load(open(path))
data[name] = {"result": result, "reason": reason, "step_timing": json.loads(timing or "null")}
json.dump(data, open(path, "w"), indent=2, sort_keys=True)
EOF
  printf '%-24s %-5s %s\n' "$1" "$2" "$3"
}

failed=0
while IFS= read -r name; do
  dir="$out/$name"
  rm -rf "$dir"
  mkdir -p "$dir"
  plan="$dir/plan.json"
  # The previous server's memory first: vLLM would refuse to start (and this would read as a FAIL).
  if ! waited="$("$PY" -m connector_tax.commands.for_tools wait-released "$config" "$name" --gpu "$gpu" 2>"$dir/wait.log")"; then
    record "$name" FAIL "$(tail -n 1 "$dir/wait.log")" "null"
    failed=1
    continue
  fi
  echo "gpu_smoke: $name: GPU $gpu released after ${waited} s" >"$dir/wait.log"
  "$PY" -m connector_tax.commands.for_tools plan "$config" "$name" --port "$port" --check smoke >"$plan"
  if ! verify_start_sidecars "$plan" "$config" "$name" "$dir" "$dir/check.log"; then
    record "$name" FAIL "${SIDECAR_REASON:-a sidecar did not start (see $dir/check.log)}" null
    failed=1
    continue
  fi
  "$PY" -m connector_tax.cli launch-command --config "$config" --variant "$name" --port "$port" \
    --step-log "$dir/engine_step.jsonl" ${SIDECAR_ARGS[@]+"${SIDECAR_ARGS[@]}"} --script >"$dir/launch.sh"
  set -m
  bash "$dir/launch.sh" >"$dir/server.log" 2>&1 </dev/null &
  pid=$!
  set +m
  VERIFY_GROUPS+=("$pid")
  verdict="$("$PY" "$VERIFY_TOOLS/preflight_client.py" check --plan "$plan" --pid "$pid" \
    --log "$dir/check.log" --server-log "$dir/server.log" --start-timeout "$start_timeout" | tail -n 1)" || true
  verify_stop_group "$pid"
  verify_stop_sidecars
  has_connector="$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["has_connector"])' "$plan")"
  connector_flag="--no-connector"
  [ "$has_connector" = True ] && connector_flag="--connector"
  timing="$("$PY" -m connector_tax.commands.for_tools step-timing "$dir/engine_step.jsonl" "$connector_flag" || true)"
  if [ "$verdict" = OK ]; then
    if "$PY" -c 'import json, sys; sys.exit(0 if json.loads(sys.argv[1])["step_timing_available"] else 1)' "$timing"; then
      record "$name" PASS "served the requests; step log filled" "$timing"
    else
      reason="$("$PY" -c 'import json, sys; print(json.loads(sys.argv[1])["reason"])' "$timing")"
      record "$name" FAIL "served the requests, but step timing: $reason" "$timing"
      failed=1
    fi
  else
    reason="$(verify_reason "${verdict#FAIL: }" "$dir/server.log")"
    # "Mooncake is not available", "NIXL is not available", "No module named 'lmcache'", ...
    # (the patterns live in connector_tax.serving.server_process.MISSING_CONNECTOR)
    if missing="$("$PY" -m connector_tax.commands.for_tools missing-connector "$dir/server.log")"; then
      record "$name" SKIP "optional connector package missing: $missing ($reason)" "$timing"
    else
      record "$name" FAIL "$reason" "$timing"
      failed=1
    fi
  fi
done <<<"$names"

echo "gpu_smoke: summary in $summary"
exit "$failed"
