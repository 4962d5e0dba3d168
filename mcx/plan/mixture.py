"""What a run will read of each dataset of its training data: tokens, share, epochs (D60). Pure.

A component read for more than ``REPEAT_WARN`` epochs is warned about: Muennighoff et al. (2023, "Scaling
Data-Constrained Language Models") found up to about four epochs of repeated data nearly as good as new data,
and the value of more repetition falling fast after that.
"""

from __future__ import annotations

from attrs import asdict, frozen

REPEAT_WARN = 4.0


@frozen(kw_only=True)
class DataRow:
    """One component of a run's training data as the run reads it."""

    name: str
    tokens: int  # in its training split
    share: float
    tokens_read: int
    epochs: float | None  # None: the component has no training tokens

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def data_rows(parts: list[tuple[str, str, int, float]], samples: int, seq_length: int) -> tuple[list[DataRow], list[str]]:
    """Rows (name, tokens in its training split, share, tokens the run reads, epochs) for ``parts`` of (name,
    key, training tokens, share), a run of ``samples`` training samples of ``seq_length`` tokens; and warnings."""
    rows: list[DataRow] = []
    warnings: list[str] = []
    for name, key, tokens, share in parts:
        read = share * samples * seq_length
        epochs = read / tokens if tokens > 0 else None
        rows.append(DataRow(name=name, tokens=tokens, share=share, tokens_read=int(read), epochs=epochs))
        if epochs is not None and epochs > REPEAT_WARN:
            warnings.append(f"{key.removesuffix('.path')}: the run reads its {tokens:,} training tokens {epochs:.1f} "
                            f"times (share {share:.1%}); beyond about {REPEAT_WARN:g} epochs repeated data is worth "
                            "less and less (Muennighoff et al. 2023): lower its weight or add data")
    return rows, warnings
