"""Text generation from a GPT's logits: greedy, temperature and top-k sampling.

:func:`generate` extends a sequence of token ids one token at a time: the model
sees the last ``block_size`` ids, and the next id is drawn from the logits of the
last position: ``temperature = 0`` takes the argmax (greedy), otherwise the
softmax of ``logits / temperature``, restricted to the ``top_k`` largest logits
when ``top_k > 0``. Draws come from ``numpy.random.default_rng(seed)``, so a seed
gives the same text on every rank and every run. Cost: one forward pass over up
to ``block_size`` tokens per new token (no key/value cache).

:func:`sample_text` does the same from text to text with a corpus's tokenizer.
Every worker runs it alike (a strategy may communicate inside forward); the
caller prints rank 0's copy.
"""

from __future__ import annotations

import numpy as np


def next_token(logits: np.ndarray, temperature: float, top_k: int, rng) -> int:
    """One id from a row of logits (float64 math)."""
    logits = np.asarray(logits, dtype=np.float64)
    if temperature == 0:
        return int(np.argmax(logits))
    z = logits / temperature
    if 0 < top_k < len(z):
        kth = np.partition(z, len(z) - top_k)[len(z) - top_k]
        z = np.where(z >= kth, z, -np.inf)
    p = np.exp(z - z.max())
    p /= p.sum()
    return int(min(np.searchsorted(np.cumsum(p), rng.random(), side="right"), len(p) - 1))


def generate(model, ids, n_new: int, *, temperature: float = 1.0, top_k: int = 0, seed: int = 0,
             vocab_limit: int | None = None) -> np.ndarray:
    """``ids`` followed by ``n_new`` generated ids (int64). ``vocab_limit``: draw only ids below it
    (a model whose vocabulary is larger than its corpus's)."""
    from hpcdp.autograd import Tensor, no_grad

    out = [int(i) for i in np.asarray(ids, dtype=np.int64).reshape(-1)]
    if not out:
        raise ValueError("generate needs at least one id to start from")
    rng = np.random.default_rng(seed)
    was_training = getattr(model, "training", True)
    if hasattr(model, "eval"):
        model.eval()
    try:
        with no_grad():
            for _ in range(n_new):
                ctx = np.array(out[-model.block_size:], dtype=np.int64)[None, :]
                logits = model(Tensor(ctx, backend=model.backend)).numpy()[0, -1]
                if vocab_limit is not None:
                    logits = logits[:vocab_limit]
                out.append(next_token(logits, temperature, top_k, rng))
    finally:
        if was_training and hasattr(model, "train"):
            model.train()
    return np.array(out, dtype=np.int64)


def sample_text(model, tokenizer, prompt: str, n_new: int, *, temperature: float = 0.8,
                top_k: int = 0, seed: int = 0) -> str:
    """The prompt (default: a newline) and ``n_new`` generated tokens, decoded."""
    ids = tokenizer.encode(prompt or "\n", "sample.prompt")
    new = generate(model, ids, n_new, temperature=temperature, top_k=top_k, seed=seed,
                   vocab_limit=tokenizer.vocab_size)
    return tokenizer.decode(new)


def sample_at_end(model, ds, sample_cfg, writer, run_dir) -> str | None:
    """After training on a token corpus: generate ``sample.length`` tokens on every worker;
    the writer (rank 0, else None) logs the text and saves it as ``<run_dir>/sample.txt``."""
    tokenizer = ds.info.get("tokenizer")
    if tokenizer is None or sample_cfg.length == 0:
        return None
    text = sample_text(model, tokenizer, sample_cfg.prompt, sample_cfg.length,
                       temperature=sample_cfg.temperature, top_k=sample_cfg.top_k, seed=sample_cfg.seed)
    if writer is not None:
        from pathlib import Path

        (Path(run_dir) / "sample.txt").write_text(text, encoding="utf-8")
        writer.log(f"sample ({sample_cfg.length} tokens, temperature {sample_cfg.temperature:g}, "
                   f"top_k {sample_cfg.top_k}):\n{text}\n--- end of sample (saved to {run_dir}/sample.txt)")
    return text
