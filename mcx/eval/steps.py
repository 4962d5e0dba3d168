"""The checkpoints ``[eval] every = N`` evaluates: the full stage's steps at multiples of N (D71). Its own module
with no imports, as the training worker reads it too (to save and keep those checkpoints) and every module the
worker imports is part of the run ID's code component."""


def every_steps(every: int | None, last: int) -> tuple[int, ...]:
    """The multiples of ``every`` up to ``last``; none when it is unset or 0."""
    return tuple(range(every, last + 1, every)) if every else ()
