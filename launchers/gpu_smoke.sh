#!/usr/bin/env bash
# GPU smoke test, one command, a few minutes on one GPU, no network needed:
# a random-initialised bert-base-sized encoder (configs/models/bert-base.json, no pretrained
# weights, random token ids so no tokenizer download), DeepSpeed ZeRO-2, bf16, VaSCL and
# SimCSE at a global batch of 1024 and max length 32. Prints the median step time,
# sentences/s, model TFLOP/s per device, peak GPU memory per objective and the VaSCL / SimCSE
# step-time ratio; PEAK_TFLOPS (the GPU's dense bf16 peak) adds MFU.
#
#   bash launchers/gpu_smoke.sh                  # results also in runs/gpu_smoke/bench_step.json
#   PEAK_TFLOPS=989 bash launchers/gpu_smoke.sh  # e.g. an H100 SXM
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-runs/gpu_smoke}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python -m vascl_scale bench step \
  --model configs/models/bert-base.json \
  --global-batch 1024 --max-length 32 \
  --objective vascl,simcse --steps 20 --warmup 5 \
  --precision bf16 --deepspeed configs/deepspeed/zero2.json \
  --peak-tflops "${PEAK_TFLOPS:-0}" \
  --output "$out/bench_step.json"
