#!/bin/bash
# Call A: one-GPU work on the two GPUs of nvidia-h200-x2, one track per GPU.
cd "$(dirname "$0")/../.." && source benchmarks/gpu/prelude.sh
nvidia-smi --query-gpu=index,uuid,utilization.gpu,memory.used,memory.total,power.draw,temperature.gpu,clocks.sm --format=csv,noheader,nounits > /tmp/res/nvidia_smi_query.csv
python3 -c "from mcx.train.system import NvmlProbe, SmiProbe; print('NVML', NvmlProbe(None).sample()); print('SMI', SmiProbe(None).sample())" > /tmp/res/probes.txt 2>&1
V=benchmarks/gpu_validation.py; T=benchmarks/throughput.py; S=experiments/h200_1gpu.toml
(
  timeout 300 python3 $V mcx-run --gpus 0 --out /tmp/res --tag 1gpu --timeout 290 -- $S --yes
  CUDA_VISIBLE_DEVICES=0 timeout 125 python3 $T --spec $S --impl te --mbs 2 --steps 6 --warmup 2 --timeout 115 --work-dir /tmp/w/te --out /tmp/res/throughput_1gpu_te.json
  CUDA_VISIBLE_DEVICES=0 timeout 70 python3 $T --spec $S --impl local --mbs 4 --steps 5 --warmup 2 --runners mcx --timeout 65 --work-dir /tmp/w/l4 --out /tmp/res/throughput_1gpu_local_mbs4.json
  CUDA_VISIBLE_DEVICES=0 timeout 65 python3 $T --spec $S --impl local --mbs 2 --steps 5 --warmup 2 --runners mcx --timeout 60 --work-dir /tmp/w/l2 --out /tmp/res/throughput_1gpu_local_mcx.json
) > $OUT/gpu0.log 2>&1 &
P0=$!
(
  timeout 320 python3 $V fp8-curve --gpus 1 --steps 300 --out /tmp/res --timeout 150
  CUDA_VISIBLE_DEVICES=1 timeout 70 python3 $T --spec $S --impl te --fp8 hybrid --mbs 2 --steps 5 --warmup 2 --runners mcx --timeout 65 --work-dir /tmp/w/f8 --out /tmp/res/throughput_1gpu_te_fp8.json
  CUDA_VISIBLE_DEVICES=1 timeout 70 python3 $T --spec $S --impl local --mbs 2 --steps 5 --warmup 2 --runners mcx --deterministic --timeout 65 --work-dir /tmp/w/det --out /tmp/res/throughput_1gpu_local_det.json
  timeout 150 python3 $V layouts --gpus 1 --only ref,ref-long,ref-moe,det-1gpu --out /tmp/res --tag refs --timeout 50
) > $OUT/gpu1.log 2>&1 &
P1=$!
(sleep 555; tar czf $OUT/res_a.tgz -C /tmp/res .; python3 benchmarks/gpu/summarize.py /tmp/res | tail -c 9000) &
wait $P0 $P1
tar czf $OUT/res_a.tgz -C /tmp/res .
python3 benchmarks/gpu/summarize.py /tmp/res 2>&1 | tail -c 9000
