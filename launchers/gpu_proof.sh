#!/usr/bin/env bash
# The GPU proof: what a CPU cannot show, in one command of at most 8 minutes on one GPU with no
# network (docs/gpu-proof.md). Stages, in this order:
#   install         the carried wheelhouse (gpu-carry/wheels, packed by launchers/gpu_carry.sh),
#                   --no-index, only what is missing; torch and its neighbours stay as installed
#   env             GPU, memory, driver, torch / CUDA / NCCL versions, the dense bf16 peak for MFU
#                   (vascl_scale/bench/peaks.py, or PEAK_TFLOPS), a large bf16 product's TFLOP/s
#   bench_uncached  bench step on a random bert-base (configs/models/bert-base.json), global batch
#   bench_cached    1024, length 32, bf16, VaSCL and SimCSE: step times, TFLOP/s, MFU, memory;
#                   one forward, then the cached step in chunks of 256
#   train           the carried all-MiniLM-L6-v2 (bf16 on the carry, float32 on disk here) with
#                   configs/cpu-demo.yaml at B = 1024, chunks of 256, bf16: stopped at step 100,
#                   resumed from that checkpoint and finished at 200
#   eval            eval sts (the 7 tasks) of the carried model and of the trained run
#   pytest_gpu      the tests marked gpu
#   zero2_bench     bench_uncached under DeepSpeed ZeRO-2 (configs/deepspeed/zero2.json)
#   zero2_train     train under ZeRO-2, stopped at step 10 and resumed to 20
#   fsdp_train      train under FSDP2 (configs/fsdp/full-shard.yaml) with the cached step,
#                   stopped at step 10 and resumed to 20 from its DCP checkpoint (the dry run:
#                   2 CPU processes, so the shards are real)
#   decoder_lora    a random Qwen3-style decoder (configs/models/qwen3-small.json: hidden 1024,
#                   8 layers) with a byte-level BPE tokenizer trained on the carried sentences,
#                   configs/qwen3-0.6b-lora-vascl.yaml (LoRA r = 16, last-token pooling) under
#                   ZeRO-3 with the cached step: B = 256, chunks of 64, length 128, bf16, stopped
#                   at step 10 and resumed to 20; steps/s, peak memory, trainable parameters
#   packed_bench    the carried MiniLM on passages of 1-24 carried sentences at length 512, cached
#                   (B = 256, chunks of 64), FlashAttention-2: padded length-sorted chunks, the
#                   same in row order, and packed rows (model.packed) in the same rounds; the dry
#                   run takes the packed code path through sdpa's dense mask
#   bench_compiled  bench_uncached with --compile: each step also with the encoder through
#                   torch.compile, in the same rounds as eager; the compiled rows' warm-up
#                   steps (the compiling) reported apart; last, as the stage most likely to
#                   run out of time
# Each stage is its own process with its own time limit; a failure is recorded and the next
# stage runs. Output in $OUT if set, else runs/gpu_proof (dry run: runs/gpu_proof-dry-run):
# <stage>.json, logs/<stage>.log, stages.tsv and summary.json (each stage's status, seconds and
# key figures, printed at the end). Exit 0 when no stage failed or ran out of time (a stage
# skipped saying why, e.g. ZeRO-2 where DeepSpeed is not installed, is not a failure), else 1.
#
#   bash launchers/gpu_carry.sh                  # once, on a machine with the package registry
#   bash launchers/gpu_proof.sh                  # on the GPU machine, gpu-carry/ carried along
#   bash launchers/gpu_proof.sh --dry-run        # any CPU: tiny stand-ins, every stage (CI runs it)
#   bash launchers/gpu_proof.sh --only train,eval   # some stages; --skip NAME,... leaves some out
# Environment: OUT; GPU_CARRY (default gpu-carry); PEAK_TFLOPS (overrides the table); PYTHON
# (default python3); PROOF_BUDGET_S (every stage together: default 450, dry run 900);
# GPU_PROOF_WORK (checkpoints, the float32 model; default a temporary directory, removed at the end).
set -u
cd "$(dirname "$0")/.."
REPO="$(pwd)"
SELF="$REPO/launchers/gpu_proof.sh"
TOOLS="$REPO/tools/gpu_proof_tools.py"
STAGES=(install env bench_uncached bench_cached train eval pytest_gpu zero2_bench zero2_train fsdp_train decoder_lora
  packed_bench bench_compiled)
SKIPPED=77  # a stage's exit status for "skipped; the reason is in <stage>.skip"

# ------------------------------------------------------------------ settings of the two modes
settings() {
  if [ "$DRY_RUN" = 1 ]; then
    PRECISION=no  # bf16 is refused on CPUs without native bf16: the dry run checks plumbing, not speed
    BENCH_MODEL="$CARRY/bench-model.json" BENCH_BATCH=32 BENCH_LENGTH=16 BENCH_CHUNK=8 BENCH_STEPS=2 BENCH_WARMUP=1
    TRAIN_BATCH=16 TRAIN_CHUNK=4 TRAIN_STEPS=8 TRAIN_STOP=4 TRAIN_LOG=2 TRAIN_WORKERS=0 TRAIN_K=4
    ZERO_STEPS=4 ZERO_STOP=2 FSDP_PROCESSES=2
    # 2 processes: ZeRO-3 reduces gradients and partitions the optimiser state over two ranks.
    DECODER_MODEL="$CARRY/decoder-model.json" DECODER_VOCAB=320 DECODER_DTYPE=float32 DECODER_PROCESSES=2
    DECODER_BATCH=16 DECODER_CHUNK=4 DECODER_LENGTH=32 DECODER_STEPS=4 DECODER_STOP=2
    PACKED_LENGTH=48 PACKED_BATCH=16 PACKED_CHUNK=4 PACKED_ATTENTION=sdpa
    EVAL_TASKS=(--task stsb)
    BUDGET_TOTAL="${PROOF_BUDGET_S:-900}" STAGE_BUDGET=240
  else
    PRECISION=bf16
    BENCH_MODEL=configs/models/bert-base.json BENCH_BATCH=1024 BENCH_LENGTH=32 BENCH_CHUNK=256 BENCH_STEPS=10 BENCH_WARMUP=3
    TRAIN_BATCH=1024 TRAIN_CHUNK=256 TRAIN_STEPS=200 TRAIN_STOP=100 TRAIN_LOG=10 TRAIN_WORKERS=2 TRAIN_K=16
    ZERO_STEPS=20 ZERO_STOP=10 FSDP_PROCESSES=1
    DECODER_MODEL=configs/models/qwen3-small.json DECODER_VOCAB=8192 DECODER_DTYPE=bfloat16 DECODER_PROCESSES=1
    DECODER_BATCH=256 DECODER_CHUNK=64 DECODER_LENGTH=128 DECODER_STEPS=20 DECODER_STOP=10
    PACKED_LENGTH=512 PACKED_BATCH=256 PACKED_CHUNK=64 PACKED_ATTENTION=flash_attention_2
    EVAL_TASKS=()  # all seven: sts12-16, stsb, sickr
    BUDGET_TOTAL="${PROOF_BUDGET_S:-450}" STAGE_BUDGET=
  fi
}

# Seconds each stage may take on the GPU (the dry run gives each STAGE_BUDGET); all of them
# together are held to BUDGET_TOTAL, so late stages get what is left.
declare -A GPU_BUDGET=([install]=90 [env]=60 [bench_uncached]=90 [bench_cached]=90 [train]=150 [eval]=60
  [pytest_gpu]=90 [zero2_bench]=120 [zero2_train]=120 [fsdp_train]=120 [decoder_lora]=180 [packed_bench]=120 [bench_compiled]=150)

tools() { "$PYTHON" "$TOOLS" "$@"; }
cli() { "$PYTHON" -m vascl_scale "$@"; }
skip() { echo "$1" > "$OUT_DIR/$STAGE.skip"; echo "skipped: $1"; exit "$SKIPPED"; }

need_deepspeed() {
  local why
  why="$("$PYTHON" -c 'import deepspeed' 2>&1 | tail -n 1)" && return 0
  skip "DeepSpeed cannot be imported here ($why); pack it into the carry (launchers/gpu_carry.sh) to run ZeRO-2"
}

need_peft() {
  local why
  why="$("$PYTHON" -c 'import peft' 2>&1 | tail -n 1)" && return 0
  skip "peft cannot be imported here ($why); pack it into the carry (launchers/gpu_carry.sh) to train with LoRA"
}

ensure_model() {  # the carried bf16 model as float32 in $WORK/minilm (once for all stages)
  [ -f "$WORK/minilm/model.safetensors" ] || tools unpack-model "$CARRY/minilm-bf16" "$WORK/minilm"
}

# ------------------------------------------------------------------ the stages
stage_install() {
  tools verify "$CARRY" || exit 1
  local pins="$WORK/pins.txt"
  tools pins > "$pins" || exit 1
  echo "kept as installed: $(tr '\n' ' ' < "$pins")"
  local pip=("$PYTHON" -m pip install --no-index --only-binary=:all: --find-links "$CARRY/wheels" -c "$pins")
  if [ "$DRY_RUN" = 1 ]; then
    # The same resolution with nothing installed: this environment must already hold everything.
    "${pip[@]}" --dry-run -r launchers/gpu_requirements.txt || exit 1
  elif ! PIP_BREAK_SYSTEM_PACKAGES=1 "${pip[@]}" -r launchers/gpu_requirements.txt; then
    echo "pip could not resolve the requirements against the wheelhouse: installing each missing wheel alone (--no-deps)"
    local wheels=()
    mapfile -t wheels < <(tools missing-wheels "$CARRY/wheels")
    [ "${#wheels[@]}" -eq 0 ] || PIP_BREAK_SYSTEM_PACKAGES=1 "$PYTHON" -m pip install --no-index --no-deps "${wheels[@]}" || exit 1
  fi
  "$PYTHON" -c 'import pydantic, webdataset, pytest, vascl_scale.train.trainer, vascl_scale.eval.sts' || exit 1
  "$PYTHON" -c 'import deepspeed; print("deepspeed", deepspeed.__version__, "imports")' \
    || echo "deepspeed does not import: the ZeRO-2 stages will be skipped"
}

stage_env() {
  tools environment "$OUT_DIR/env.json" "$DRY_RUN"
}

bench() {  # CHUNK_SIZE [bench step options...]
  local chunk="$1" peak
  shift
  peak="$(tools peak "$DRY_RUN")" || exit 1
  cli bench step --model "$BENCH_MODEL" --global-batch "$BENCH_BATCH" --max-length "$BENCH_LENGTH" \
    --chunk-size "$chunk" --objective vascl,simcse --steps "$BENCH_STEPS" --warmup "$BENCH_WARMUP" \
    --precision "$PRECISION" --peak-tflops "$peak" "$@" --output "$OUT_DIR/$STAGE.json"
}
stage_bench_uncached() { bench 0; }
stage_bench_cached() { bench "$BENCH_CHUNK"; }
stage_zero2_bench() { need_deepspeed; bench 0 --deepspeed configs/deepspeed/zero2.json; }
stage_bench_compiled() { bench 0 --compile; }

train_twice() {  # CONFIG MODEL_NOTE STEPS STOP [train options...]: steps 1-STOP, stop, resume, STOP+1 to STEPS
  local config="$1" note="$2" steps="$3" stop="$4" peak
  shift 4
  peak="$(tools peak "$DRY_RUN")" || exit 1
  local run="$WORK/$STAGE"
  local args=(--config "$config" --output "$run" --set "data.train=\"$CARRY/data/corpus/train.txt.gz\""
    --set "eval.stsb_dev=\"$CARRY/data/sts/stsb/dev.tsv\"" --set "eval.every_steps=$stop"
    --set "train.precision=$PRECISION" --set "train.peak_tflops=$peak" --set "train.log_every=$TRAIN_LOG"
    --set "checkpoint.every_steps=$stop" --set "data.num_workers=$TRAIN_WORKERS" "$@")
  rm -rf "$run"
  echo "-- steps 1-$stop, then stopped (--max-steps $stop)"
  cli train "${args[@]}" --max-steps "$stop" || exit 1
  echo "-- resumed from its checkpoint: steps $((stop + 1))-$steps"
  cli train "${args[@]}" --max-steps "$steps" --resume || exit 1
  tools train-report "$run" "$stop" "$steps" "$OUT_DIR/$STAGE.json" "$note"  # read from $run/run_summary.json
}
stop_and_resume() {  # STEPS STOP [train options...]: the carried MiniLM with configs/cpu-demo.yaml
  local steps="$1" stop="$2"
  shift 2
  ensure_model || exit 1
  train_twice configs/cpu-demo.yaml "the carry's minilm-bf16, widened to float32 on disk (bf16-rounded weights)" \
    "$steps" "$stop" --objective vascl --set "model.path=\"$WORK/minilm\"" \
    --set "train.global_batch_size=$TRAIN_BATCH" --set "train.chunk_size=$TRAIN_CHUNK" --set "loss.k=$TRAIN_K" "$@"
}
stage_train() { stop_and_resume "$TRAIN_STEPS" "$TRAIN_STOP"; }
stage_zero2_train() { need_deepspeed; stop_and_resume "$ZERO_STEPS" "$ZERO_STOP" --deepspeed configs/deepspeed/zero2.json; }
stage_fsdp_train() {
  stop_and_resume "$ZERO_STEPS" "$ZERO_STOP" --fsdp configs/fsdp/full-shard.yaml --num-processes "$FSDP_PROCESSES"
}

stage_decoder_lora() {  # the decoder recipe's LoRA, last-token pooling and ZeRO-3 on a random decoder
  need_deepspeed
  need_peft
  local model="$WORK/decoder"
  tools decoder-model "$DECODER_MODEL" "$CARRY/data/corpus/train.txt.gz" "$DECODER_VOCAB" "$DECODER_DTYPE" "$model" || exit 1
  train_twice configs/qwen3-0.6b-lora-vascl.yaml \
    "a random decoder of $(basename "$DECODER_MODEL") ($DECODER_DTYPE), its BPE tokenizer trained on the carried sentences" \
    "$DECODER_STEPS" "$DECODER_STOP" --num-processes "$DECODER_PROCESSES" --deepspeed configs/deepspeed/zero3.json \
    --set "model.path=\"$model\"" --set "model.dtype=$DECODER_DTYPE" --set "data.max_length=$DECODER_LENGTH" \
    --set "train.global_batch_size=$DECODER_BATCH" --set "train.chunk_size=$DECODER_CHUNK" --set "loss.k=$TRAIN_K"
}

stage_packed_bench() {  # padded (length-sorted, and in row order) against packed rows at length 512
  ensure_model || exit 1
  if [ "$DRY_RUN" != 1 ]; then
    local why
    why="$("$PYTHON" -c 'import flash_attn' 2>&1 | tail -n 1)" \
      || skip "flash-attn cannot be imported here ($why); pack its wheel into the carry to time packed rows"
  fi
  tools passages "$CARRY/data/corpus/train.txt.gz" "$WORK/passages.txt" 24 || exit 1
  cli bench step --model "$WORK/minilm" --text "$WORK/passages.txt" --max-length "$PACKED_LENGTH" \
    --global-batch "$PACKED_BATCH" --chunk-size "$PACKED_CHUNK" --objective simcse --steps "$BENCH_STEPS" \
    --warmup "$BENCH_WARMUP" --precision "$PRECISION" --attn-implementation "$PACKED_ATTENTION" --packed --row-order \
    --output "$OUT_DIR/$STAGE.json"
}

stage_eval() {
  ensure_model || exit 1
  local models=(--model "$WORK/minilm") trained=1
  if [ -f "$WORK/train/final/model.safetensors" ]; then
    models+=(--model "$WORK/train")
  else
    trained=0
    echo "no trained run in $WORK/train (the train stage failed or did not run): the carried model alone"
  fi
  cli eval sts "${models[@]}" "${EVAL_TASKS[@]}" --data-dir "$CARRY/data" --no-cache --output "$OUT_DIR/eval.json" || exit 1
  [ "$trained" = 1 ] || { echo "eval: nothing trained to evaluate"; exit 1; }
}

stage_pytest_gpu() {
  local files=()
  mapfile -t files < <(grep -l "pytest.mark.gpu" tests/test_*.py)
  # Only the files holding gpu tests: the others import packages this machine may lack.
  COLUMNS=120 "$PYTHON" -m pytest -m gpu -q -rs -p no:cacheprovider --junitxml "$OUT_DIR/pytest_gpu.xml" "${files[@]}"
}

# ------------------------------------------------------------------ the runner
run_stage() {  # NAME: run it under its time limit, record status, exit code, seconds and a note
  local name="$1" budget left started rc status note seconds
  budget="${STAGE_BUDGET:-${GPU_BUDGET[$name]}}"
  left=$((DEADLINE - $(date +%s)))
  if [ "$left" -lt 15 ]; then
    printf '%s\tskipped\t0\t0\tout of time: %s s left of PROOF_BUDGET_S=%s\n' "$name" "$left" "$BUDGET_TOTAL" >> "$OUT_DIR/stages.tsv"
    echo "== $name: skipped, out of time"
    return
  fi
  [ "$budget" -le "$left" ] || budget="$left"
  echo "== $name (at most $budget s; log: $OUT_DIR/logs/$name.log)"
  started="$(date +%s.%N)"
  STAGE="$name" timeout --kill-after=15 "$budget" bash "$SELF" --stage "$name" > "$OUT_DIR/logs/$name.log" 2>&1
  rc=$?
  seconds="$(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')"
  case "$rc" in
    0) status=ok note="" ;;
    "$SKIPPED") status=skipped note="$(head -c 300 "$OUT_DIR/$name.skip" 2>/dev/null)" ;;
    124 | 137) status=timeout note="stopped after its limit of $budget s" ;;
    *) status=failed note="exit $rc: $(grep -v '^\s*$' "$OUT_DIR/logs/$name.log" | tail -n 1 | tr '\t' ' ' | head -c 300)" ;;
  esac
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$rc" "$seconds" "$note" >> "$OUT_DIR/stages.tsv"
  tail -n 8 "$OUT_DIR/logs/$name.log" | cut -c 1-240 | sed 's/^/   | /'
  echo "   $name: $status in $seconds s${note:+ ($note)}"
}

usage() { sed -n '2,/^set -u/p' "$SELF" | sed '$d' | sed 's/^# \{0,1\}//'; }

in_list() {  # WORD LIST(comma separated)
  case ",$2," in *",$1,"*) return 0 ;; *) return 1 ;; esac
}

main() {
  local dry=0 only="" leave="" stage=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --dry-run) dry=1 ;;
      --only) only="${2:?--only takes stage names, comma separated}"; shift ;;
      --skip) leave="${2:?--skip takes stage names, comma separated}"; shift ;;
      --stage) stage="${2:?}"; shift ;;
      -h | --help) usage; exit 0 ;;
      *) echo "unknown option $1 (--dry-run, --only STAGES, --skip STAGES, --help)" >&2; exit 2 ;;
    esac
    shift
  done
  for name in ${only//,/ } ${leave//,/ }; do
    in_list "$name" "$(IFS=,; echo "${STAGES[*]}")" || { echo "unknown stage $name; the stages: ${STAGES[*]}" >&2; exit 2; }
  done
  if [ -n "$stage" ]; then  # one stage, in its own process (run_stage): the settings come exported
    set -o pipefail
    settings
    "stage_$stage"
    exit $?
  fi

  DRY_RUN="$dry"
  PYTHON="${PYTHON:-python3}"
  case "$PYTHON" in */*) PYTHON="$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")" ;; esac  # a path: absolute
  export DRY_RUN PYTHON COLUMNS=400  # rich wraps log lines at the terminal's width
  export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # nothing is downloaded, whatever is missing
  if [ "$DRY_RUN" = 1 ]; then
    OUT_DIR="${OUT:-runs/gpu_proof-dry-run}"
  else
    OUT_DIR="${OUT:-runs/gpu_proof}"
  fi
  mkdir -p "$OUT_DIR/logs" || exit 1
  OUT_DIR="$(cd "$OUT_DIR" && pwd)"
  for name in "${STAGES[@]}" fixtures; do  # this script's files of an earlier run, nothing else
    rm -f "$OUT_DIR/$name.json" "$OUT_DIR/$name.skip" "$OUT_DIR/logs/$name.log"
  done
  rm -f "$OUT_DIR/run.json" "$OUT_DIR/summary.json" "$OUT_DIR/eval.md" "$OUT_DIR/pytest_gpu.xml"
  : > "$OUT_DIR/stages.tsv"
  if [ -n "${GPU_PROOF_WORK:-}" ]; then
    mkdir -p "$GPU_PROOF_WORK" && WORK="$(cd "$GPU_PROOF_WORK" && pwd)" || exit 1
  else
    WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu-proof.XXXXXX")" || exit 1
    trap 'rm -rf "$WORK"' EXIT
  fi
  if [ "$DRY_RUN" = 1 ]; then
    export DS_ACCELERATOR=cpu  # DeepSpeed would find no GPU and say so at every import
    CARRY="$WORK/carry"
    echo "== dry run: tiny stand-ins in $CARRY (no wheelhouse: the current environment)"
    tools dry-fixtures "$CARRY" > "$OUT_DIR/logs/fixtures.log" 2>&1 || { cat "$OUT_DIR/logs/fixtures.log"; exit 1; }
  else
    CARRY="${GPU_CARRY:-gpu-carry}"
    [ -d "$CARRY" ] || { echo "no carry at $CARRY: pack it with bash launchers/gpu_carry.sh (or set GPU_CARRY)" >&2; exit 2; }
    CARRY="$(cd "$CARRY" && pwd)"
  fi
  export OUT_DIR WORK CARRY
  settings
  DEADLINE=$(($(date +%s) + BUDGET_TOTAL))
  tools run-record "$OUT_DIR/run.json" "$DRY_RUN" "$CARRY" "$BUDGET_TOTAL" "${only:--}" "${leave:--}" || exit 1
  echo "== gpu proof: $([ "$DRY_RUN" = 1 ] && echo 'dry run (CPU)' || echo GPU), output $OUT_DIR, carry $CARRY," \
    "at most $BUDGET_TOTAL s in all"
  for name in "${STAGES[@]}"; do
    if { [ -n "$only" ] && ! in_list "$name" "$only"; } || in_list "$name" "$leave"; then
      continue
    fi
    run_stage "$name"
  done
  tools summary "$OUT_DIR"
}

main "$@"
