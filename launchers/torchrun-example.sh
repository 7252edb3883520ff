#!/bin/bash
# vascl-scale under torchrun instead of its own launcher: torchrun sets RANK / WORLD_SIZE, so
# `vascl-scale train` trains directly in each worker. All other flags are the same.
set -euo pipefail
CONFIG=${CONFIG:-configs/vascl-roberta-base.yaml}
DEEPSPEED=${DEEPSPEED:-configs/deepspeed/zero2.json}
# FSDP2 instead of DeepSpeed: FSDP=configs/fsdp/full-shard.yaml (one node) or hybrid-shard.yaml (many).
ENGINE=(--deepspeed "$DEEPSPEED")
if [ -n "${FSDP:-}" ]; then
  ENGINE=(--fsdp "$FSDP")
fi

# One node, 8 GPUs:
#   torchrun --standalone --nproc_per_node 8 -m vascl_scale train --config "$CONFIG" --deepspeed "$DEEPSPEED"
#   torchrun --standalone --nproc_per_node 8 -m vascl_scale train --config "$CONFIG" --fsdp configs/fsdp/full-shard.yaml
# Two nodes: run on each, with NODE_RANK 0 or 1 and MAIN_HOST the address of node 0:
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
NPROC_PER_NODE=${NPROC_PER_NODE:-8}
MAIN_HOST=${MAIN_HOST:-127.0.0.1}
MAIN_PORT=${MAIN_PORT:-29500}
exec torchrun --nnodes "$NNODES" --node_rank "$NODE_RANK" --nproc_per_node "$NPROC_PER_NODE" \
  --rdzv_backend c10d --rdzv_endpoint "$MAIN_HOST:$MAIN_PORT" \
  -m vascl_scale train --config "$CONFIG" "${ENGINE[@]}" "$@"
