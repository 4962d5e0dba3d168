#!/bin/bash
# Session 8, call A on nvidia-h200 (one GPU), from shallow clones of main (.snap, run from) and of branch
# rehearsal2 (.snap2): where the first asynchronous checkpoint save's pause goes, now that the writer logs its
# own timing (D31). No Transformer Engine: the layout runs' model on the local spec, as call F of session 7.
# 1. host_staging.py: pinned buffers (cudaHostAlloc against cudaHostRegister with 8 threads) and the disk (first
#    write against second).
# 2. ckpt-stall, synchronous and asynchronous, main: saves at steps 20, 40, 60, 80, 100.
# 3. ckpt-stall, asynchronous: rehearsal2; main with the cudaHostRegister setting; rehearsal2 with it.
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site ../.whl/*.whl || exit 1
mkdir -p /tmp/res
(sleep 565; tar czf $OUT/res_s8a.tgz -C /tmp/res .) &
REG=pinned_use_cuda_host_register:True,pinned_num_register_threads:8
PYTHONPATH=/tmp/site timeout 60 python3 benchmarks/host_staging.py --gib 1.3 --tensors 64 --dir /tmp/hs \
  --out /tmp/res/host_staging.json 2>&1 | cut -c1-300
stall() {  # stall NAME SNAPSHOT MODES [VAR=VALUE...]: one ckpt-stall run of the small dense model, local spec
  local name=$1 snap=$2 modes=$3; shift 3
  (cd $snap && env "$@" PYTHONPATH=/tmp/site:$PWD timeout 240 python3 benchmarks/gpu_validation.py ckpt-stall \
    --gpus 0 --spec dense --steps 101 --every 20 --modes $modes --set 'model.transformer_impl="local"' \
    --out /tmp/res/$name --work-dir /tmp/gv_$name --timeout 110 > $OUT/$name.log 2>&1)
  tail -n 1 $OUT/$name.log
  for m in sync async; do
    grep -h "paused training\|in the writer\|prepared" /tmp/gv_$name/ckptstall/$m/worker.log 2>/dev/null | cut -c24-330
  done
}
stall main . sync,async
stall rehearsal ../.snap2 async
stall main_reg . async PYTORCH_CUDA_ALLOC_CONF=$REG
stall rehearsal_reg ../.snap2 async PYTORCH_CUDA_ALLOC_CONF=$REG
tar czf $OUT/res_s8a.tgz -C /tmp/res .
