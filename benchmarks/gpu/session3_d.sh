#!/bin/bash
# Session 3, the last call (the remaining device time, without Transformer Engine), as run from the
# repository root. The operator precedence of the first line put everything before the first `&` into
# one background job, so the SIGTERM case ran (in .snap/) and the checkpoint-stall run started in the
# repository root without PYTHONPATH and failed at once ("No module named 'mcx'").
cd .snap && export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site ../.whl/*.whl && export PYTHONPATH=/tmp/site:$PWD && mkdir -p /tmp/res && (timeout 150 python3 benchmarks/gpu_validation.py faults --only sigterm --gpus 0 --out /tmp/res --timeout 140 > /tmp/res/d0.log 2>&1) & P0=$!; (timeout 150 python3 benchmarks/gpu_validation.py ckpt-stall --gpus 1 --spec dense --steps 16 --every 5 --out /tmp/res --timeout 72 > /tmp/res/d1.log 2>&1) & P1=$!; wait $P0 $P1; tar czf $OUT/res_s3d.tgz -C /tmp/res .; tail -c 600 /tmp/res/d0.log; tail -c 600 /tmp/res/d1.log
