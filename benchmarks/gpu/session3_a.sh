#!/bin/bash
# Session 3, call A on nvidia-h200-x2: one-GPU work, one track per GPU.
# GPU 0: the throughput levers on the one-H200 spec (Transformer Engine; local spec at micro-batch 4 last): mcx against the bare loop
#   with the fusions off (overhead ratio), then gradient-accumulation fusion, + fused cross entropy,
#   micro-batch 4, FP8 at micro-batch 2 and 4.
# GPU 1: the GPU fault cases (issue 8), `mcx run` + `mcx reproduce` on the TE path (issue 11), the
#   layout reference with the fusions on (a correctness check against session 2's 5.9572), and the
#   local-spec levers.
cd "$(dirname "$0")/../.." && source benchmarks/gpu/prelude.sh
git --version; nvidia-smi --query-gpu=index,name,memory.used --format=csv,noheader
V=benchmarks/gpu_validation.py; T=benchmarks/throughput.py; S=experiments/h200_1gpu.toml
NOF="--set train.gradient_accumulation_fusion=false --set train.cross_entropy_fusion=false"
tp() {  # tp GPU TIMEOUT NAME ARGS...: one throughput.py run on one GPU
  local g=$1 to=$2 name=$3; shift 3
  CUDA_VISIBLE_DEVICES=$g timeout $to python3 $T --spec $S --steps 5 --warmup 2 --timeout $((to - 5)) \
    --work-dir /tmp/w/$name --out /tmp/res/throughput_$name.json "$@" 2>&1 | grep -v "mcx step" | tail -n 4
}
(sleep 555; tar czf $OUT/res_s3a.tgz -C /tmp/res .; python3 benchmarks/gpu/summarize.py /tmp/res | tail -c 9000) &
(
  tp 0 115 1gpu_te_bare_nofusion --impl te --mbs 2 --runners bare,mcx $NOF
  tp 0 65 1gpu_te_wgrad --impl te --mbs 2 --runners mcx --set train.cross_entropy_fusion=false
  tp 0 80 1gpu_te_fused --impl te --mbs 2 --runners mcx
  tp 0 80 1gpu_te_fp8_fused --impl te --fp8 hybrid --mbs 2 --runners mcx
  tp 0 80 1gpu_te_fused_mbs4 --impl te --mbs 4 --runners mcx
  tp 0 80 1gpu_te_fp8_fused_mbs4 --impl te --fp8 hybrid --mbs 4 --runners mcx
  tp 0 80 1gpu_local_fused_mbs4 --impl local --mbs 4 --runners mcx
) > $OUT/g0.log 2>&1 &
P0=$!
(
  timeout 230 python3 $V faults --gpus 1 --out /tmp/res --timeout 90
  CUDA_VISIBLE_DEVICES=1 timeout 150 python3 -m mcx run experiments/tiny.toml --set 'hardware.gpu="H200"' \
    --set 'train.precision="bf16"' --set train.train_iters=40 --yes --json > /tmp/res/tiny_run.txt 2>&1
  RID=$(python3 -c "import json; print(json.loads(open('/tmp/res/tiny_run.txt').read().strip().splitlines()[-1])['run_id'])")
  CUDA_VISIBLE_DEVICES=1 timeout 150 python3 -m mcx reproduce "$RID" --json > /tmp/res/tiny_reproduce.txt 2>&1
  tar czf /tmp/res/tiny_runs.tgz --exclude=checkpoints .mcx/runs
  timeout 80 python3 $V layouts --gpus 1 --only ref --out /tmp/res --tag fused --timeout 70
  tp 1 65 1gpu_local_nofusion --impl local --mbs 2 --runners mcx $NOF
  tp 1 80 1gpu_local_fused --impl local --mbs 2 --runners mcx
) > $OUT/g1.log 2>&1 &
P1=$!
wait $P0 $P1
tar czf $OUT/res_s3a.tgz -C /tmp/res .
python3 benchmarks/gpu/summarize.py /tmp/res 2>&1 | tail -c 7000; tail -c 1200 /tmp/res/tiny_reproduce.txt
