#!/usr/bin/env bash
# One command for a GPU host's environment: vLLM 0.33.0 (a CUDA 13 build) and the KV connectors'
# builds for the same CUDA major, pinned, in one virtual environment, as tools/vllm_cpu_env.sh is
# for the CPU.
#
#   tools/vllm_gpu_env.sh [VENV_DIR] [--python PYTHON] [--force]
#
# VENV_DIR defaults to $CONNECTOR_TAX_VLLM_GPU_VENV, else /work/venvs/vllm-gpu. What it installs,
# and why these builds (read off the wheels' METADATA and their .so files' NEEDED entries):
#   * vllm==0.33.0: its _C extensions need libcudart.so.13 and libcuda.so.1; it pins torch==2.14.0
#     (a CUDA 13 build on PyPI), torchvision==0.29.0, torchaudio==2.11.0, flashinfer-python;
#   * mooncake-transfer-engine-cuda13==0.3.13.post1 (not mooncake-transfer-engine, whose engine.so
#     needs libcudart.so.12): engine.so needs libcudart.so.13, libcuda.so.1 and the system's
#     libibverbs.so.1, libmlx5.so.1, libnuma.so.1 and libcurl.so.4;
#   * nixl-cu13==1.5.1 and the `nixl` meta-package 1.5.1 (--no-deps: its metadata asks for
#     nixl-cu12 as well): vLLM imports `nixl._api`, which only the meta-package provides; it picks
#     nixl_cu13 by torch's CUDA major;
#   * lmcache==0.5.6, resolved with vLLM in one pip run (it needs cupy-cuda13x, cuda-python 13,
#     numpy <= 2.2.6 and protobuf 6): its cuda_ops need libcudart.so.13.
# System libraries (Debian/Ubuntu packages): libibverbs1, ibverbs-providers (libmlx5.so.1),
# libnuma1, libcurl4; installed with apt-get when this runs as root with apt-get, else named.
# The NVIDIA driver (libcuda.so.1) comes with the GPU host, not from here.
#
# It ends with the check: torch's CUDA major is vLLM's (13); each connector's module (the one
# vLLM imports) imports; on a host without the NVIDIA driver a module whose shared library needs
# libcuda.so.1 cannot be loaded, so it is recorded as "needs the NVIDIA driver" with `ldd`'s word
# that every other library it needs resolves: that part, and anything touching a GPU, can only be
# checked on a GPU host (tools/gpu_smoke.sh). The marker .connector-tax-vllm-gpu.json records
# every version (vLLM, torch, CUDA, each connector) and each check's outcome; a re-run on a
# finished venv with the same pins does nothing (--force rebuilds). About 6 GB of downloads the
# first time (torch's CUDA libraries are most of it). Bad arguments: exit 2; a failed step: 1.
set -euo pipefail

prog="vllm_gpu_env.sh"
die() { echo "$prog: $*" >&2; exit 2; }
fail() { echo "$prog: $*" >&2; exit 1; }

venv="${CONNECTOR_TAX_VLLM_GPU_VENV:-/work/venvs/vllm-gpu}"
python="${PYTHON:-python3}"
force=0
venv_given=0
VLLM_PIN=vllm==0.33.0
CUDA_MAJOR=13
# Resolved together with vLLM (their dependencies must agree with its torch and numpy).
PINS=(mooncake-transfer-engine-cuda13==0.3.13.post1 nixl-cu13==1.5.1 lmcache==0.5.6)
# Installed --no-deps: the meta-package's own dependencies would pull the CUDA 12 build too.
NO_DEPS=(nixl==1.5.1)
SYSTEM_PACKAGES=(libibverbs1 ibverbs-providers libnuma1 libcurl4)
while [ $# -gt 0 ]; do
  case "$1" in
    --python) [ $# -ge 2 ] || die "--python needs an interpreter"; python="$2"; shift 2 ;;
    --force) force=1; shift ;;
    -h | --help) sed -n '2,36p' "$0"; exit 0 ;;
    -*) die "unknown argument: $1" ;;
    *)
      [ "$venv_given" = 0 ] || die "VENV_DIR given twice: '$venv' and '$1'"
      venv="$1"; venv_given=1; shift ;;
  esac
done
command -v "$python" >/dev/null 2>&1 || die "--python: '$python' not found"
"$python" -c 'import sys; sys.exit(0 if (3, 11) <= sys.version_info < (3, 15) else 1)' \
  || die "--python: '$python' is not Python 3.11-3.14 (vLLM 0.33.0's Requires-Python)"

marker="$venv/.connector-tax-vllm-gpu.json"
vpy="$venv/bin/python"
pins="$VLLM_PIN ${PINS[*]} ${NO_DEPS[*]}"
if [ "$force" = 0 ] && [ -f "$marker" ] && [ -x "$vpy" ] \
  && "$vpy" -c 'import json, sys; d = json.load(open(sys.argv[1])); sys.exit(0 if d.get("pins") == sys.argv[2] and not d.get("problems") else 1)' \
    "$marker" "$pins" 2>/dev/null; then
  echo "$prog: $venv already holds $pins (--force rebuilds it)"
  echo "$vpy"
  exit 0
fi

start=$SECONDS
# The system libraries the connectors' shared objects need, as the dynamic loader finds them.
missing_libs() {
  local lib
  for lib in libibverbs.so.1 libmlx5.so.1 libnuma.so.1 libcurl.so.4; do
    ldconfig -p 2>/dev/null | grep -q "$lib " || printf '%s ' "$lib"
  done
}
if [ -n "$(missing_libs)" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "$prog: installing system packages (apt-get): ${SYSTEM_PACKAGES[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq "${SYSTEM_PACKAGES[@]}" >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq "${SYSTEM_PACKAGES[@]}" >/dev/null 2>&1; } \
    || echo "$prog: apt-get install ${SYSTEM_PACKAGES[*]} failed" >&2
fi
if [ -n "$(missing_libs)" ]; then
  echo "$prog: missing system libraries: $(missing_libs)(install ${SYSTEM_PACKAGES[*]}); until then Mooncake's configurations end as SKIP" >&2
fi

if [ -e "$venv" ]; then
  [ -x "$vpy" ] || die "VENV_DIR: $venv exists and is not a virtual environment; remove it or pick another"
  echo "$prog: updating $venv"
  rm -f "$marker"
else
  mkdir -p "$(dirname "$venv")" || die "VENV_DIR: cannot create $(dirname "$venv")"
  "$python" -m venv "$venv" || fail "python -m venv $venv failed"
fi
pip=("$vpy" -m pip --disable-pip-version-check)
echo "$prog: installing $VLLM_PIN ${PINS[*]} into $venv (several GB the first time)"
"${pip[@]}" install --quiet --upgrade pip || fail "pip upgrade failed"
"${pip[@]}" install --quiet "$VLLM_PIN" "${PINS[@]}" || fail "pip install $VLLM_PIN ${PINS[*]} failed"
"${pip[@]}" install --quiet --no-deps "${NO_DEPS[@]}" || fail "pip install --no-deps ${NO_DEPS[*]} failed"
installed_s=$((SECONDS - start))

# The check (see the header). Runs in vLLM's Python; prints one JSON line.
check="$("$vpy" - "$CUDA_MAJOR" <<'PY'
import ctypes.util, importlib, importlib.metadata as md, json, os, pathlib, subprocess, sys

cuda_major = int(sys.argv[1])
out = {"python": sys.version.split()[0]}
for dist in ("vllm", "torch", "torchvision", "torchaudio", "flashinfer-python", "numpy", "protobuf",
             "cupy-cuda13x", "cuda-python"):
    try:
        out[dist] = md.version(dist)
    except md.PackageNotFoundError:
        out[dist] = None
import torch  # noqa: E402 - after the versions, so a broken torch still leaves them

out["torch_cuda"] = torch.version.cuda
out["driver"] = "present" if ctypes.util.find_library("cuda") else "absent (no NVIDIA driver on this host)"
problems = []
if not torch.version.cuda or int(torch.version.cuda.split(".")[0]) != cuda_major:
    problems.append(f"torch {torch.__version__} is built for CUDA {torch.version.cuda}, vLLM 0.33.0 for CUDA {cuda_major}")


def unresolved(module):
    """`ldd`'s 'not found' libraries of the module's package's shared objects, with the folders
    the process has once torch is imported (torch/lib, the nvidia-* wheels' lib folders) on the
    loader's path, as they are when vLLM loads them."""
    site = pathlib.Path(torch.__file__).parent.parent
    paths = [str(site / "torch" / "lib"), *map(str, sorted(site.glob("nvidia/**/lib")))]
    env = {**os.environ, "LD_LIBRARY_PATH": ":".join(paths)}
    name = module.split(".")[0]
    found = set()
    for so in sorted((site / name).glob("**/*.so")):
        done = subprocess.run(["ldd", str(so)], capture_output=True, text=True, env=env)
        found |= {line.split()[0] for line in done.stdout.splitlines() if "not found" in line}
    return sorted(found)


checks = {  # distribution -> the module vLLM imports for it
    "mooncake-transfer-engine-cuda13": "mooncake.engine",
    "nixl": "nixl._api",
    "nixl-cu13": "nixl_cu13._api",
    "lmcache": "lmcache.integration.vllm.vllm_v1_adapter",
    "vllm": "vllm._C_stable_libtorch",
}
connectors = {}
for dist, module in checks.items():
    try:
        entry = {"version": md.version(dist), "module": module}
    except md.PackageNotFoundError:
        connectors[dist] = {"version": None, "module": module, "imports": False, "error": "not installed"}
        problems.append(f"{dist} is not installed")
        continue
    try:
        importlib.import_module(module)
        entry["imports"] = True
    except Exception as exc:  # noqa: BLE001 - recorded with its cause
        entry.update(imports=False, error=f"{type(exc).__name__}: {exc}")
        if "libcuda.so.1" in str(exc) and out["driver"].startswith("absent"):
            missing = unresolved(module if dist != "nixl" else "nixl_cu13._api")
            entry["needs_driver"] = True
            entry["unresolved"] = missing
            if set(missing) - {"libcuda.so.1"}:
                problems.append(f"{module}: besides the driver, {', '.join(sorted(set(missing) - {'libcuda.so.1'}))} not found")
        else:
            problems.append(f"{module}: {entry['error']}")
    connectors[dist] = entry
out["connectors"] = connectors
out["problems"] = problems
print(json.dumps(out))
PY
)" || fail "the check could not run in $venv (see the traceback above)"

"$vpy" - "$marker" "$check" "$pins" "$installed_s" "$(missing_libs)" <<'PY' || fail "see above"
import json, sys
path, check, pins, seconds, missing = sys.argv[1:6]
data = json.loads(check)
data.update(pins=pins, install_s=int(seconds), missing_system_libraries=missing.split())
json.dump(data, open(path, "w"), indent=1, sort_keys=True)
for dist, entry in data["connectors"].items():
    if entry.get("imports"):
        state = "imports"
    elif entry.get("needs_driver"):
        state = "needs the NVIDIA driver (libcuda.so.1) to load: not checkable on this host; every other library it needs resolves" if entry["unresolved"] == ["libcuda.so.1"] else f"does not load: {entry['unresolved']} not found"
    else:
        state = f"does not import: {entry.get('error')}"
    print(f"vllm_gpu_env.sh: {dist} {entry.get('version')} ({entry['module']}): {state}")
print(f"vllm_gpu_env.sh: vllm {data['vllm']}, torch {data['torch']} (CUDA {data['torch_cuda']}), driver {data['driver']}")
if data["problems"]:
    sys.exit("vllm_gpu_env.sh: " + "; ".join(data["problems"]))
PY
echo "$prog: ready in $((SECONDS - start)) s; marker $marker"
echo "$vpy"
