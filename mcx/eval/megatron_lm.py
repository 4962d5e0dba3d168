"""lm-evaluation-harness's model interface over a run's own Megatron-Core GPTModel (D72): the harness scores the
weights the run trained, in the process that loaded them, with no Hugging Face export in between.

The requests are answered as the harness's ``HFLM`` answers them (lm_eval/models/huggingface.py, 0.4.13), so the
scores are the same within float32 rounding:

* ``loglikelihood``: TemplateLM's encoding of (context, continuation); requests sorted longest first, requests
  that differ only in their last continuation token share one row (HFLM's ``logits_cache``), ``batch_size`` rows
  right-padded into one forward (causal attention: padding after a row never reaches its scored positions);
  the log-softmax over the true vocabulary (Megatron-Core pads the output layer to a multiple of 128 rows: those
  logits are cut before the softmax, as the export cuts the rows).
* ``loglikelihood_rolling``: the harness's disjoint rolling windows of ``max_length`` tokens, batched likewise.
* ``generate_until``: greedy (argmax), one request at a time, the whole sequence run again for each new token
  (no KV cache: Megatron-Core's inference engine wants CUDA); stops at a stop sequence, the end-of-document token
  or ``max_gen_toks``. Right for the short answers of the generative tasks mcx evaluates on CPU; a long generative
  suite is faster through the export (`[eval] model = "hf"`).

Tokens come from the run's own tokenizer (mcx.data.tokenizer, the dataset's files) with no special tokens added,
as training saw documents; the end-of-document token is the harness's end of text and its empty-context prefix.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM  # type: ignore[import-untyped]
from lm_eval.models.utils import (  # type: ignore[import-untyped]
    Collator,
    handle_stop_sequences,
    normalize_gen_kwargs,
    postprocess_generated_text,
)
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window  # type: ignore[import-untyped]

from mcx.data.tokenizer import Tokenizer

MAX_GEN_TOKS = 256  # HFLM's default when a task names none


class MegatronLM(TemplateLM):
    """``model``: a GPTModel (pre- and post-process, one process) in eval mode on ``device``; ``vocab_size``: the
    tokenizer's, at most the model's (padded) output rows; ``max_length``: the model's context."""

    def __init__(self, model: torch.nn.Module, tokenizer: Tokenizer, *, vocab_size: int, max_length: int,
                 batch_size: int, device: torch.device) -> None:
        super().__init__()
        self.model, self.tok, self.vocab_size = model, tokenizer, vocab_size
        self._max_length, self._batch_size, self._device = max_length, batch_size, device

    @property
    def eot_token_id(self) -> int:
        return self.tok.eod

    @property
    def max_length(self) -> int:
        return self._max_length

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        return self.tok.encode(string)

    def tok_decode(self, tokens: list[int]) -> str:
        return self.tok.decode(tokens)

    @torch.no_grad()
    def _log_probs(self, rows: list[list[int]]) -> torch.Tensor:
        """One forward of ``rows`` right-padded to the longest: [rows, length, vocab] log-probabilities."""
        width = max(len(r) for r in rows)
        tokens = torch.zeros(len(rows), width, dtype=torch.long)  # token 0 after a row, as HFLM pads
        for i, row in enumerate(rows):
            tokens[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        tokens = tokens.to(self._device)
        positions = torch.arange(width, device=self._device).unsqueeze(0).expand_as(tokens)
        logits = self.model(tokens, positions, None)  # [rows, length, padded vocab]
        return F.log_softmax(logits[..., : self.vocab_size].float(), dim=-1)

    def _loglikelihood_tokens(self, requests: list[tuple[tuple[str, str] | None, list[int], list[int]]],
                              disable_tqdm: bool = False, **kwargs: Any) -> list[tuple[float, bool]]:
        """(log-prob of the continuation, whether greedy decoding yields it) per request, in request order."""
        order = Collator(requests, sort_fn=lambda r: (-len(r[1] + r[2]), tuple(r[1] + r[2])),
                         group_by="contexts", group_fn=lambda r: r[-2] + r[-1][:-1])
        out: list[tuple[float, bool]] = []
        for chunk in order.get_batched(n=self._batch_size, batch_fn=None):
            # the input: context + continuation without its last token, left-truncated to the context
            rows = [(ctx + cont)[-(self.max_length + 1):][:-1] for _, ctx, cont in chunk]
            scored = self._log_probs(rows)
            for (request, ctx, cont), row, probs in zip(chunk, rows, scored, strict=True):
                probs = probs[len(row) - len(cont): len(row)].unsqueeze(0)  # the continuation's positions
                greedy = probs.argmax(dim=-1)
                for request, cont_toks, sliced in order.get_cache(req_str=request, cxt_toks=ctx, cont_toks=cont,
                                                                  logits=probs):
                    want = torch.tensor(cont_toks, dtype=torch.long, device=sliced.device).unsqueeze(0)
                    same = bool((greedy[:, -want.shape[1]:] == want).all())
                    answer = (float(torch.gather(sliced, 2, want.unsqueeze(-1)).sum()), same)
                    out.append(answer)
                    if request is not None:
                        self.cache_hook.add_partial("loglikelihood", request, answer)
        return order.get_original(out)

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """The whole string's log-likelihood, summed over the harness's disjoint rolling windows."""
        windows: list[tuple[int, tuple[None, list[int], list[int]]]] = []
        for i, (string,) in enumerate(req.args for req in requests):
            for window in get_rolling_token_windows(token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                                                    max_seq_len=self.max_length, context_len=1):
                windows.append((i, (None, *make_disjoint_window(window))))
        totals = [0.0] * len(requests)
        for start in range(0, len(windows), self._batch_size):
            batch = windows[start: start + self._batch_size]
            for (i, _), (logprob, _) in zip(batch, self._loglikelihood_tokens([w for _, w in batch]), strict=True):
                totals[i] += logprob
        for req, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    @torch.no_grad()
    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Greedy continuations, each cut at its first stop sequence."""
        eos = self.tok_decode([self.eot_token_id])
        out = []
        for req in requests:
            context, gen_kwargs = req.args
            kwargs = normalize_gen_kwargs(gen_kwargs, MAX_GEN_TOKS)
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
            max_gen = int(kwargs.pop("max_gen_toks"))
            if max_gen >= self.max_length:
                raise ValueError(f"max_gen_toks {max_gen} leaves no context in the model's {self.max_length} tokens")
            tokens = self.tok_encode(context)[-(self.max_length - max_gen):]
            generated: list[int] = []
            text = ""
            for _ in range(max_gen):
                nxt = int(self._log_probs([tokens + generated])[0, -1].argmax())
                if nxt == self.eot_token_id:
                    break
                generated.append(nxt)
                text = self.tok_decode(generated)
                if any(stop and stop in text for stop in until):
                    break
            text = postprocess_generated_text(generation=text, stop=until, think_end_token=None)
            self.cache_hook.add_partial("generate_until", req.args, text)
            out.append(text)
        return out
