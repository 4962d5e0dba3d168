#!/bin/bash
# The GPU runs still to make, call 2 of 2 on nvidia-h200-x2: two-GPU work, and reproduce on a GPU.
cd "$(dirname "$0")/../.." && source benchmarks/gpu/prelude.sh
V=benchmarks/gpu_validation.py; T=benchmarks/throughput.py
(sleep 560; tar czf $OUT/res_next_b.tgz -C /tmp/res .; python3 benchmarks/gpu/summarize.py /tmp/res | tail -c 9000) &
timeout 150 python3 $V layouts --gpus 0,1 --only ep2 --out /tmp/res --tag ep --timeout 140 > $OUT/n0.log 2>&1
timeout 150 python3 $T --spec experiments/h200_2gpu.toml --gpus 2 --impl te --fp8 hybrid --seq 8192 --mbs 1 --steps 4 --warmup 2 \
  --runners mcx --timeout 140 --work-dir /tmp/w/f88 --out /tmp/res/throughput_2gpu_te_fp8_seq8192.json > $OUT/n1.log 2>&1
# reproduce on the GPU: a short deterministic run of the quickstart shapes, then `mcx reproduce` of it
CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m mcx run experiments/tiny.toml --set 'hardware.gpu="H200"' \
  --set 'train.precision="bf16"' --set train.train_iters=40 --yes --json > /tmp/res/tiny_run.txt 2>&1
RID=$(python3 -c "import json,sys; print(json.loads(open('/tmp/res/tiny_run.txt').read().strip().splitlines()[-1])['run_id'])")
CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m mcx reproduce "$RID" --json > /tmp/res/tiny_reproduce.txt 2>&1
tar czf $OUT/res_next_b.tgz -C /tmp/res .
python3 benchmarks/gpu/summarize.py /tmp/res 2>&1 | tail -c 9000; tail -c 1500 /tmp/res/tiny_reproduce.txt
