#!/bin/bash
# Session 5, call C on nvidia-h200-x2, after calls A and B:
# GPU 0: mcx on the local spec (no Transformer Engine) at micro-batch 4, train.rope_fusion off then on
#   (MCore's RoPE torch.compile'd, +2.4% on the bare loop in call B); then FP8 at micro-batch 4 with
#   torch's expandable segments (fragmentation; the allocator setting alone).
# GPU 1: bf16 at micro-batch 4 beside FP8 and bf16 at micro-batch 8 with expandable segments (call A:
#   micro-batch 8 ran out of memory with 10 GiB reserved but unallocated, 122 GiB planned).
# Then both GPUs: the MoE reference and EP 2 on Transformer Engine again, with the worker's raised
#   recompile limit (call A: both failed resume_bitwise after dynamo's limit of 8 in MoE's SwiGLU).
cd "$(dirname "$0")/../.." && source benchmarks/gpu/prelude.sh
(sleep 555; tar czf $OUT/res_s5c.tgz -C /tmp/res .; python3 benchmarks/gpu/summarize.py /tmp/res | tail -c 9000) &
rm -f /tmp/res/*.json
EXP=expandable_segments:True
(
  one 0 local_mbs4_norope 100 --impl local --set train.rope_fusion=false
  one 0 local_mbs4_rope 120 --impl local
  (export PYTORCH_CUDA_ALLOC_CONF=$EXP; one 0 te_fp8_mbs4_exp 85 --fp8 hybrid)
) > $OUT/g0.log 2>&1 &
P0=$!
(
  one 1 te_mbs4_c 85
  (export PYTORCH_CUDA_ALLOC_CONF=$EXP; one 1 te_fp8_mbs8_exp 110 --mbs 8 --fp8 hybrid)
  (export PYTORCH_CUDA_ALLOC_CONF=$EXP; one 1 te_mbs8_exp 110 --mbs 8)
) > $OUT/g1.log 2>&1 &
P1=$!
wait $P0 $P1
TORCH_LOGS=recompiles timeout 250 python3 $V layouts --gpus 0,1 --only ref-moe,ep2 --out /tmp/res --tag ep --timeout 120 \
  --work-dir /tmp/gvc > $OUT/ep.log 2>&1
find /tmp/gvc -name worker.log | while read f; do echo "== $f"; grep -i "recompil" "$f" | head -20; done > $OUT/recompiles.txt
tar czf $OUT/res_s5c.tgz -C /tmp/res .
python3 benchmarks/gpu/summarize.py /tmp/res 2>&1 | tail -c 9000
