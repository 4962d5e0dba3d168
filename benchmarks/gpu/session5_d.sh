#!/bin/bash
# Session 5, call D on nvidia-h200-x2 (the last 6 minutes of device time): calls A and C found the MoE
# layouts on Transformer Engine (non-deterministic mode) failing the smoke stage's bitwise resume, with the
# recompile limit raised too. Are they bitwise in deterministic mode?
cd "$(dirname "$0")/../.." && source benchmarks/gpu/prelude.sh
(sleep 262; tar czf $OUT/res_s5d.tgz -C /tmp/res .; python3 benchmarks/gpu/summarize.py /tmp/res | tail -c 9000) &
rm -f /tmp/res/*.json
timeout 255 python3 $V layouts --gpus 0,1 --only ref-moe-det,ep2-det --out /tmp/res --tag epdet --timeout 112 \
  --work-dir /tmp/gvd > $OUT/epdet.log 2>&1
tar czf $OUT/res_s5d.tgz -C /tmp/res .
python3 benchmarks/gpu/summarize.py /tmp/res 2>&1 | tail -c 9000
