"""Megatron's fused weight-gradient accumulation, without apex.

With ``gradient_accumulation_fusion`` Megatron-Core's linear layers accumulate each weight gradient
straight into the parameter's fp32 ``main_grad`` buffer with one GEMM (``beta = 1``), instead of
writing a bf16 gradient and adding it to ``main_grad`` in a second pass over every parameter, once
per micro-batch. Transformer Engine's linears do this themselves; MCore's own linears (the output
layer, and every linear of the local spec) call apex's ``fused_weight_gradient_mlp_cuda``, a CUDA
extension built from apex's sources that Megatron-LM turns the fusion off without.

cuBLAS runs the same mixed-precision GEMM (bf16 inputs, fp32 accumulator and output) through
``torch.addmm(..., out_dtype=torch.float32)`` (torch >= 2.8 on CUDA). ``enable`` hands MCore's
linear layers that function in apex's place when apex is absent, after checking it on the GPU
against an fp32 reference; where the check fails (an older torch), the fusion stays off as in
Megatron-LM. Used on CUDA only: the CPU backend trains with torch's optimizer and has no
``main_grad`` buffers.
"""

from __future__ import annotations

import types

import torch

_state: dict[str, str] = {}  # "impl" once decided for this process


def _accumulate(total_input: torch.Tensor, grad_output: torch.Tensor, main_grad: torch.Tensor) -> None:
    """main_grad += grad_output^T @ total_input, accumulated and written in main_grad's dtype.
    total_input: [tokens, in]; grad_output: [tokens, out]; main_grad: [out, in]."""
    if main_grad.dtype == total_input.dtype:
        main_grad.addmm_(grad_output.t(), total_input)
    else:
        torch.addmm(main_grad, grad_output.t(), total_input, out_dtype=main_grad.dtype, out=main_grad)


def _works(device: torch.device) -> bool:
    """One small GEMM per case on the GPU, against the fp32 reference, accumulated in place."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    for grad_dtype in (torch.float32, torch.bfloat16):
        inp = torch.randn(96, 48, generator=gen).to(device, torch.bfloat16)
        out = torch.randn(96, 64, generator=gen).to(device, torch.bfloat16)
        start = torch.randn(64, 48, generator=gen).to(device, grad_dtype)
        main_grad = start.clone()
        pointer = main_grad.data_ptr()
        try:
            _accumulate(inp, out, main_grad)
        except (RuntimeError, TypeError, NotImplementedError):
            return False
        want = start.float() + out.float().t() @ inp.float()
        tol = 1e-3 if grad_dtype == torch.float32 else 5e-2
        if main_grad.data_ptr() != pointer or not torch.allclose(main_grad.float(), want, rtol=tol, atol=tol):
            return False
    return True


def enable(device: torch.device) -> str:
    """Make gradient-accumulation fusion available to MCore's linear layers on ``device``; returns
    the implementation: "apex", "cublas (torch.addmm out_dtype)" or "unavailable"."""
    if "impl" in _state:
        return _state["impl"]
    from megatron.core.tensor_parallel import layers

    if layers._grad_accum_fusion_available:
        impl = "apex"
    elif device.type == "cuda" and _works(device):
        layers.fused_weight_gradient_mlp_cuda = types.SimpleNamespace(
            wgrad_gemm_accum_fp32=_accumulate, wgrad_gemm_accum_fp16=_accumulate)
        layers._grad_accum_fusion_available = True
        impl = "cublas (torch.addmm out_dtype)"
    else:
        impl = "unavailable"
    _state["impl"] = impl
    return impl


def current() -> str | None:
    """The implementation ``enable`` chose in this process, if it ran."""
    return _state.get("impl")
