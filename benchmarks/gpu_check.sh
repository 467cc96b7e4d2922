#!/usr/bin/env bash
# The GPU check in one command: `make gpu-check`, or `bash benchmarks/gpu_check.sh [ARGS]`
# (ARGS go to benchmarks/gpu_check.py: `--device cpu --dry-run` checks the script on a CPU,
# `--out DIR` says where gpu_check.json, gpu_check.md and the logs go; default $OUT or
# gpu-check-out/).
#
# On a GPU image that has torch, transformers, accelerate, peft, pyarrow, pandas and rich but not
# trl, datasets, bitsandbytes or gguf, and no PyPI or Hub, it first installs the wheels that
# `make gpu-pack` put in .gpu-pack/ and rebuilds the embedded model's GGUF from its two halves.
# One call to a lent GPU machine carries at most 64 MiB, so the pack is three folders of under
# 60 MiB, carried by three calls in a row while the machine stays warm (files a call carried stay
# there for the next):
#   run "true"                                  carry .gpu-pack/a   (small wheels, GGUF half 1)
#   run "true"                                  carry .gpu-pack/b   (GGUF half 2)
#   run "bash benchmarks/gpu_check.sh --call 1" carry .gpu-pack/c   (bitsandbytes)
#   run "bash benchmarks/gpu_check.sh --call 2"                     (one device call runs <= 10 min)
set -euo pipefail
cd "$(dirname "$0")/.."
PACK=${GPU_PACK:-.gpu-pack}
SITE=${GPU_SITE:-/tmp/gpu-check-site}
PY=${PYTHON:-python3}
if compgen -G "$PACK/[ac]/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "$PACK"/[ac]/*.whl
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # grpo_plugin and reward_fns from the checkout
if [ -f "$PACK/a/gguf.part0" ] && [ -f "$PACK/b/gguf.part1" ]; then
    mkdir -p "$SITE/gguf"
    GGUF="$SITE/gguf/$(cat "$PACK/a/gguf.name")"
    cat "$PACK/a/gguf.part0" "$PACK/b/gguf.part1" >"$GGUF"
    echo "$(cat "$PACK/a/gguf.sha256")  $GGUF" | sha256sum -c --quiet
    export GRPO_PLUGIN_GGUF="$GGUF"
fi
if [ -f "$PACK/a/gsm8k_train.jsonl" ]; then
    export GSM8K_TRAIN="$PWD/$PACK/a/gsm8k_train.jsonl"  # vs_trl's `long` prompts
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
export GRPO_PLUGIN_CACHE="${GRPO_PLUGIN_CACHE:-$SITE/cache}"
exec "$PY" benchmarks/gpu_check.py "$@"
