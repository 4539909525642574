#!/bin/sh
# Softmax vs linear attention (Katharopoulos et al. 2020) on the Shakespeare character recipe, same steps,
# one thread, one run at a time. Usage: sh research/long_attention/train_shakespeare.sh [OUT_DIR]
OUT=${1:-runs/long_attention}
for kind in softmax linear; do
  echo "== $kind $(date -u +%H:%M:%S) load $(cat /proc/loadavg)"
  OMP_NUM_THREADS=1 nice -n 5 python -m attnlab pretrain --config configs/pretrain-gpt-shakespeare-char.yaml \
    --no-progress model.attention_kind=$kind train.max_steps=1500 train.eval_every=500 train.save_every=100000 \
    train.output_dir=$OUT/$kind data.path=$OUT/corpus
  echo "== $kind done $(date -u +%H:%M:%S) load $(cat /proc/loadavg)"
done
