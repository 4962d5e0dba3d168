"""Notes on the Megatron-LM defaults a script relies on where its name or shape suggests another model.

Megatron-LM's defaults are GPT-2's (LayerNorm, a GeLU MLP, learned positions, biases, dropout 0.1,
tied output layer). A script named like a LLaMA model, or shaped like one, that leaves those
arguments out trains the GPT-2 variants; the spec says so faithfully, and a note names the defaults
and the arguments a model of the family passes. Notes never stop an import. The family table is data.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attrs import frozen

from mcx.interop import flags as F
from mcx.interop.pretrain_args import Ctx


@frozen
class Expect:
    key: str
    value: Any  # what models of the family use
    flags: str  # the arguments that give it
    default_trains: str  # what Megatron-LM's default trains instead


@frozen
class Family:
    name: str
    words: tuple[str, ...]  # in a script's name
    signs: tuple[tuple[str, Callable[[Ctx], bool]], ...]  # shape features of the family
    min_signs: int  # this many signs make a script look like the family without its name
    expects: tuple[Expect, ...]


FAMILIES: tuple[Family, ...] = (
    Family("LLaMA", ("llama", "mistral", "mixtral"),
           (("grouped-query attention", lambda c: c.view("model.num_query_groups") is not None),
            ("RoPE", lambda c: c.view("model.position_embedding_type") == "rope"),
            ("SwiGLU", lambda c: bool(c.view("model.swiglu")))),
           2,
           (Expect("model.normalization", "RMSNorm", "--normalization RMSNorm", "LayerNorm"),
            Expect("model.swiglu", True, "--swiglu", "a GeLU MLP"),
            Expect("model.position_embedding_type", "rope", "--position-embedding-type rope",
                   "learned absolute position embeddings"),
            Expect("model.add_bias_linear", False, "--disable-bias-linear", "biases in every linear layer"),
            Expect("model.hidden_dropout", 0.0, "--hidden-dropout 0.0", "hidden dropout 0.1"),
            Expect("model.attention_dropout", 0.0, "--attention-dropout 0.0", "attention dropout 0.1"),
            Expect("model.untie_embeddings_and_output_weights", True, "--untie-embeddings-and-output-weights",
                   "the output layer tied to the input embedding"))),
)


def _left_to_default(ctx: Ctx, e: Expect) -> bool:
    given = any(a in ctx.given for a in F.BY_KEY[e.key].args)
    return not given and e.key not in ctx.pinned and ctx.view(e.key) != e.value


def _and(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def family_notes(ctx: Ctx, name: str) -> list[str]:
    """One note per family the script looks like, when it leaves that family's arguments to Megatron-LM."""
    out = []
    for fam in FAMILIES:
        signs = [label for label, present in fam.signs if present(ctx)]
        if any(w in name.lower() for w in fam.words):
            looks = f"is named like a {fam.name} model ({name})"
        elif len(signs) >= fam.min_signs:
            looks = f"is shaped like a {fam.name} model ({_and(signs)})"
        else:
            continue
        left = [e for e in fam.expects if _left_to_default(ctx, e)]
        if left:
            out.append(f"the script {looks} but leaves {len(left)} argument{'s' if len(left) > 1 else ''} to "
                       f"Megatron-LM's defaults, so it trains with {_and([e.default_trains for e in left])}; "
                       f"a {fam.name} model passes {' '.join(e.flags for e in left)}")
    return out
