# shellcheck shell=bash
# Shared body of tools/verify_*.sh (sourced, not run). One pre-flight check (docs/study-design.md):
#
#   verify_<check>.sh CONFIG OUT_DIR [--port PORT] [--only NAME] [--start-timeout S] [--run ID]
#
# For every configuration of CONFIG that the check gates (or just --only NAME): write the
# launch script with `ctax launch-command --script`, start it in its own process group, let
# tools/preflight_client.py check /health, /v1/models, the check's requests and liveness,
# stop the server, and record {"status": "ok"|"skip", "reason": ...} under the config's name
# in OUT_DIR/preflight_status.json. Logs: OUT_DIR/verify_<config>.log (the check) and
# OUT_DIR/verify_<config>.server.log (the server's output). --run ID stamps each verdict with
# the caller's run (its "run"): the pipeline's preflight takes only a verdict with its own ID,
# so an entry left in OUT_DIR by an earlier run never passes for this one.
#
# Exit status: 0 when every gated configuration got a verdict (ok or skip: a skip is a result,
# the study goes on without that configuration), 2 on bad arguments or an unusable config.
# Config values never pass through shell code: names come one per line from the package
# (they match ^[a-z0-9][a-z0-9_-]*$), everything else is in JSON or in the generated launch.sh,
# whose every word is shlex-quoted.

VERIFY_TOOLS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VERIFY_PROG="$(basename "$0")"
VERIFY_GROUPS=()
VERIFY_PIDS=()

verify_usage() {
  echo "usage: $VERIFY_PROG CONFIG OUT_DIR [--port PORT] [--only NAME] [--start-timeout SECONDS] [--run ID]" >&2
}

verify_die() {
  echo "$VERIFY_PROG: $*" >&2
  exit 2
}

# The Python that has connector_tax: $CTAX_PYTHON, else the interpreter of the `ctax` script
# on PATH, else python3.
verify_python() {
  if [ -n "${CTAX_PYTHON:-}" ]; then
    printf '%s\n' "$CTAX_PYTHON"
    return
  fi
  local ctax shebang
  ctax="$(command -v ctax || true)"
  if [ -n "$ctax" ]; then
    shebang="$(head -n 1 "$ctax")"
    shebang="${shebang#\#!}"
    if [ -x "$shebang" ]; then
      printf '%s\n' "$shebang"
      return
    fi
  fi
  printf '%s\n' python3
}

# Stop a process group we started: TERM, up to 60 s, then KILL.
verify_stop_group() {
  local pgid="$1"
  kill -TERM -- "-$pgid" 2>/dev/null || return 0
  for _ in $(seq 1 120); do
    kill -0 -- "-$pgid" 2>/dev/null || break
    sleep 0.5
  done
  kill -KILL -- "-$pgid" 2>/dev/null || true
  wait "$pgid" 2>/dev/null || true
}

# A failed check's reason; a server that died while starting gets vLLM's own root cause from its
# log (the package's reader, the same one the pipeline's ServerStartError uses), e.g.
# "server process exited during start-up: Mooncake is not available".
verify_reason() { # reason server_log
  local reason="$1" cause
  if { [ "$reason" = "server process exited during start-up" ] ||
    [ "$reason" = "engine core failed during start-up (the server hung instead of exiting)" ]; } &&
    cause="$("$PY" -m connector_tax.commands.for_tools root-cause "$2" 2>/dev/null)"; then
    reason="$reason: $cause"
  fi
  printf '%s\n' "$reason"
}

# A configuration's sidecars (an LMCache MP server: processes vLLM needs beside it), started by
# the package before the server and kept until verify_stop_sidecars; their ports become
# SIDECAR_ARGS (--sidecar-port NAME=PORT) for `ctax launch-command`. Returns 1 with the reason
# in SIDECAR_REASON when one could not start. None needed: nothing is started.
SIDECAR_PID=""
SIDECAR_ARGS=()
SIDECAR_REASON=""
verify_start_sidecars() { # plan config name dir log
  local plan="$1" config="$2" name="$3" dir="$4" log="$5" ports="$4/sidecars_$3.ports" line
  SIDECAR_PID=""
  SIDECAR_ARGS=()
  "$PY" -c 'import json, sys; sys.exit(0 if json.load(open(sys.argv[1])).get("sidecars") else 1)' "$plan" || return 0
  rm -f "$ports"
  "$PY" -m connector_tax.commands.for_tools sidecars "$config" "$name" --log-dir "$dir" --ports-file "$ports" \
    2>>"$log" &
  SIDECAR_PID=$!
  VERIFY_PIDS+=("$SIDECAR_PID")
  while [ ! -s "$ports" ]; do # the helper gives up by itself (each sidecar's ready timeout)
    if ! kill -0 "$SIDECAR_PID" 2>/dev/null; then
      SIDECAR_REASON="$(grep '^for_tools sidecars: ' "$log" | tail -n 1)"
      SIDECAR_REASON="${SIDECAR_REASON#for_tools sidecars: }"
      SIDECAR_PID=""
      return 1
    fi
    sleep 0.2
  done
  while IFS= read -r line; do SIDECAR_ARGS+=(--sidecar-port "$line"); done <"$ports"
  return 0
}

verify_stop_sidecars() {
  [ -n "$SIDECAR_PID" ] || return 0
  kill -TERM "$SIDECAR_PID" 2>/dev/null || true
  wait "$SIDECAR_PID" 2>/dev/null || true
  SIDECAR_PID=""
}

verify_cleanup() {
  local pgid pid
  for pgid in ${VERIFY_GROUPS[@]+"${VERIFY_GROUPS[@]}"}; do verify_stop_group "$pgid"; done
  for pid in ${VERIFY_PIDS[@]+"${VERIFY_PIDS[@]}"}; do kill -TERM "$pid" 2>/dev/null || true; done
}

verify_one() {
  local check="$1" config="$2" out="$3" name="$4" port="$5" start_timeout="$6" run="$7"
  local log="$out/verify_$name.log"
  local server_log="$out/verify_$name.server.log"
  local script="$out/launch_$name.sh"
  local plan="$out/verify_$name.plan.json"
  local step_log="$out/verify_$name.steps.jsonl"
  local status_file="$out/preflight_status.json"
  local boot_pid="" boot_port="" verdict reason pid
  local stamp=()
  if [ -n "$run" ]; then stamp=(--run "$run"); fi

  : >"$log"
  note() { printf '[%s] %s\n' "$(date +%Y-%m-%dT%H:%M:%S)" "$*" >>"$log"; }
  record() {
    "$PY" "$VERIFY_TOOLS/preflight_client.py" record --file "$status_file" --config "$name" \
      --status "$1" --reason "$2" --check "$check" --log "$log" ${stamp[@]+"${stamp[@]}"}
    note "verdict: $1: $2"
    printf '%s: %s: %s\n' "$name" "$1" "$2"
  }

  note "$VERIFY_PROG: $check check of $name ($config), port $port"
  if ! "$PY" -m connector_tax.commands.for_tools plan "$config" "$name" --port "$port" \
    --check "$check" >"$plan" 2>>"$log"; then
    record skip "cannot plan the check: $(tail -n 1 "$log")"
    return 0
  fi
  if ! verify_start_sidecars "$plan" "$config" "$name" "$out" "$log"; then
    record skip "${SIDECAR_REASON:-a sidecar did not start (see $log)}"
    return 0
  fi
  if ! "$PY" -m connector_tax.cli launch-command --config "$config" --variant "$name" \
    --port "$port" --step-log "$step_log" ${SIDECAR_ARGS[@]+"${SIDECAR_ARGS[@]}"} --script >"$script" 2>>"$log"; then
    record skip "no launch command: $(tail -n 1 "$log")"
    verify_stop_sidecars
    return 0
  fi
  note "launch script: $script"

  if [ "$check" = kv_consumer ]; then
    rm -f "$out/verify_$name.bootstrap.port"
    "$PY" "$VERIFY_TOOLS/dummy_bootstrap.py" --host 127.0.0.1 --port 0 \
      --log "$out/verify_$name.bootstrap.jsonl" \
      --ready-file "$out/verify_$name.bootstrap.port" 2>>"$log" &
    boot_pid=$!
    VERIFY_PIDS+=("$boot_pid")
    for _ in $(seq 1 100); do
      [ -s "$out/verify_$name.bootstrap.port" ] && break
      sleep 0.1
    done
    if [ ! -s "$out/verify_$name.bootstrap.port" ]; then
      record skip "the dummy bootstrap server did not start"
      kill -TERM "$boot_pid" 2>/dev/null || true
      return 0
    fi
    boot_port="$(cat "$out/verify_$name.bootstrap.port")"
    note "dummy Mooncake bootstrap on 127.0.0.1:$boot_port (a kv_consumer in vLLM 0.33 contacts" \
      "a bootstrap only for requests with kv_transfer_params; none are sent)"
  fi

  # Its own process group (job control), so that stopping it stops vLLM's children too.
  set -m
  bash "$script" >"$server_log" 2>&1 </dev/null &
  pid=$!
  set +m
  VERIFY_GROUPS+=("$pid")
  note "server started: pid $pid (process group $pid)"

  verdict="$("$PY" "$VERIFY_TOOLS/preflight_client.py" check --plan "$plan" --pid "$pid" \
    --log "$log" --server-log "$server_log" --start-timeout "$start_timeout" | tail -n 1)" || true

  verify_stop_group "$pid"
  note "server stopped"
  if [ -n "$SIDECAR_PID" ]; then
    if [ "$verdict" = OK ] && ! kill -0 "$SIDECAR_PID" 2>/dev/null; then # it ended during the check
      verdict="FAIL: $(grep '^for_tools sidecars: ' "$log" | tail -n 1 | sed 's/^for_tools sidecars: //')"
    fi
    verify_stop_sidecars
    note "sidecars stopped"
  fi
  if [ -n "$boot_pid" ]; then
    kill -TERM "$boot_pid" 2>/dev/null || true
    wait "$boot_pid" 2>/dev/null || true
    local contacts=0
    [ -f "$out/verify_$name.bootstrap.jsonl" ] && contacts="$(wc -l <"$out/verify_$name.bootstrap.jsonl")"
    note "the dummy bootstrap served $contacts request(s)"
  fi

  if [ "$verdict" = OK ]; then
    reason="passed: started, /v1/models, requests, /health and process alive"
    local backend timing
    backend="$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["backend"])' "$plan")"
    if [ "$backend" = vllm ]; then
      timing="$("$PY" -m connector_tax.commands.for_tools step-timing "$step_log" --connector || true)"
      note "step timing: $timing"
    fi
    record ok "$reason"
  else
    reason="$(verify_reason "${verdict#FAIL: }" "$server_log")"
    [ -n "$reason" ] || reason="the check client failed (see $log)"
    {
      echo "---- last 40 lines of $server_log ----"
      tail -n 40 "$server_log" 2>/dev/null || true
    } >>"$log"
    record skip "$reason"
  fi
  return 0
}

verify_main() {
  local check="$1"
  shift
  if [ $# -lt 2 ]; then
    verify_usage
    exit 2
  fi
  local config="$1" out="$2"
  shift 2
  local port="${VERIFY_PORT:-18100}" only="" start_timeout="${VERIFY_START_TIMEOUT:-1200}" run=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --port)
        [ $# -ge 2 ] || verify_die "--port needs a value"
        port="$2"
        shift 2
        ;;
      --only)
        [ $# -ge 2 ] || verify_die "--only needs a config name"
        only="$2"
        shift 2
        ;;
      --start-timeout)
        [ $# -ge 2 ] || verify_die "--start-timeout needs a value"
        start_timeout="$2"
        shift 2
        ;;
      --run)
        [ $# -ge 2 ] || verify_die "--run needs an ID"
        run="$2"
        shift 2
        ;;
      -h | --help)
        verify_usage
        exit 0
        ;;
      *) verify_die "unknown argument: $1" ;;
    esac
  done
  [[ "$port" =~ ^[0-9]+$ ]] || verify_die "--port: '$port' is not a port number"
  [[ "$start_timeout" =~ ^[0-9]+([.][0-9]+)?$ ]] || verify_die "--start-timeout: '$start_timeout' is not a number of seconds"
  [[ -z "$run" || "$run" =~ ^[A-Za-z0-9._-]+$ ]] || verify_die "--run: '$run' is not an ID (letters, digits, . _ -)"
  [ -f "$config" ] || verify_die "CONFIG: $config: no such file"
  mkdir -p "$out" 2>/dev/null || verify_die "OUT_DIR: cannot create $out"

  PY="$(verify_python)"
  trap verify_cleanup EXIT
  trap 'exit 130' INT TERM

  local gate_args=(gated "$config" "$check")
  [ -n "$only" ] && gate_args+=(--only "$only")
  local names
  names="$("$PY" -m connector_tax.commands.for_tools "${gate_args[@]}")" || exit 2
  if [ -z "$names" ]; then
    echo "$VERIFY_PROG: no configuration of $config needs the $check check"
    return 0
  fi
  local name
  while IFS= read -r name; do
    verify_one "$check" "$config" "$out" "$name" "$port" "$start_timeout" "$run"
  done <<<"$names"
  return 0
}
