"""How failure messages write sets of ranks, and how they are printed (no MPI)."""

from __future__ import annotations


def fmt_ranks(ranks) -> str:
    """``[3]`` -> "rank 3"; ``[0, 1, 2, 5]`` -> "ranks 0-2, 5"."""
    ranks = sorted(set(int(r) for r in ranks))
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    parts, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            parts.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return "ranks " + ", ".join(parts)


def say(line: str) -> None:
    """Write one line to stderr in ONE write call, flushed: lines of ranks that share a
    launcher's output stream stay whole (print() writes the newline separately, which
    interleaves when stderr is unbuffered)."""
    import sys
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
