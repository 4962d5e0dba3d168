"""Compact summary of the GPU validation results in a directory (for the call's output tail)."""
import json, sys
from pathlib import Path

def short(x, n=8):
    if isinstance(x, list):
        return [round(v, 4) if isinstance(v, float) else v for v in x[:n]] + (["..."] + [round(v, 4) if isinstance(v, float) else v for v in x[-3:]] if len(x) > n else [])
    return x

for f in sorted(Path(sys.argv[1]).glob("*.json")):
    d = json.loads(f.read_text())
    print(f"== {f.name}")
    if f.name.startswith("throughput"):
        for name, r in (d.get("runs") or {}).items():
            print(f"  {name}: tok/s/gpu {r.get('tokens_per_s_per_gpu')} tflops {r.get('tflops_per_gpu')} mfu {r.get('mfu')} mem {r.get('mem_peak_bytes')} loss {r.get('loss_first')}->{r.get('loss_last')} layer {r.get('layer_spec')} built {json.dumps({k: (r.get('built') or {}).get(k) for k in ('layer_spec', 'gradient_accumulation_fusion', 'cross_entropy_fusion', 'core_attention')})}")
        print(f"  ratio {d.get('ratio')} mfu {d.get('mfu')}")
        continue
    if d.get("runner") == "bare_mcore":
        print("  " + json.dumps({k: d.get(k) for k in ("tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "mem_peak_bytes",
                                                       "loss_first", "loss_last", "compile", "layer_spec")}))
        continue
    for k, v in d.items():
        if isinstance(v, dict):
            keep = {kk: (short(vv) if kk in ('losses', 'grad_norms', 'step_times', 'valid', 'mfu', 'test') else vv)
                    for kk, vv in v.items() if kk in ('rc', 'status', 'error', 'losses', 'grad_norms', 'wall_s', 'vs_reference', 'first', 'bitwise_equal_to_uninterrupted', 'valid', 'test', 'system_samples', 'system_last', 'final', 'mfu', 'layer_spec', 'speedup_median_step', 'max_relative_difference_after_warmup', 'final_relative_difference', 'resumed')}
            if v.get('checks'):
                keep['checks'] = {ck: cv.get('passed') for ck, cv in v['checks'].items()}
            if v.get('status') not in (None, 'finished') or v.get('rc') not in (0, None):
                keep['log_tail'] = (v.get('log_tail') or v.get('worker_log_tail') or v.get('stderr_tail') or '')[-1500:]
            print(f"  {k}: {json.dumps(keep, default=str)[:1800]}")
        else:
            print(f"  {k}: {str(v)[:600]}")
