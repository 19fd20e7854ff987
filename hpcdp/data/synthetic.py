"""Built-in synthetic datasets, generated deterministically from ``data.seed``.

- :func:`make_classification`: Gaussian clusters in a small latent space pushed
  through a fixed random nonlinear map (tanh layer + linear) into ``n_features``
  dimensions. Classes overlap only as much as ``noise`` says, so a small MLP can
  learn it but a linear model cannot do it perfectly.
- :func:`make_markov_sequences`: token sequences from a fixed random Markov chain of
  order 1 or 2. The chain is known, so the best possible expected cross-entropy
  (the Bayes loss, "loss floor") is computed exactly: the mean over positions of
  the conditional entropy of the next token given the tokens seen so far.
"""

from __future__ import annotations

import numpy as np

from .dataset import DataError, Dataset, split_indices


def _split(name, task, x, y, n_classes, cfg, info=None) -> Dataset:
    tr, te = split_indices(len(x), cfg.test_fraction, cfg.seed)
    return Dataset(name, task, x[tr], y[tr], x[te], y[te], n_classes, info or {})


def make_classification(cfg) -> Dataset:
    """Clusters in ``n_latent`` dims -> tanh(z A + b) B -> standardized features."""
    n, c, d, k = cfg.n_samples, cfg.n_classes, cfg.n_features, cfg.n_latent
    task_rng = np.random.default_rng([cfg.seed, 1])  # the fixed task: centres and map
    centres = task_rng.normal(0.0, 2.0, size=(c, k))
    hidden = max(2 * d, 16)
    a = task_rng.normal(0.0, 1.0 / np.sqrt(k), size=(k, hidden))
    b = task_rng.normal(0.0, 0.5, size=hidden)
    w = task_rng.normal(0.0, 1.0 / np.sqrt(hidden), size=(hidden, d))

    rng = np.random.default_rng([cfg.seed, 2])  # the samples
    y = rng.permutation(np.arange(n) % c).astype(np.int64)  # balanced classes
    z = centres[y] + cfg.noise * rng.normal(size=(n, k))
    x = np.tanh(z @ a + b) @ w
    x = (x - x.mean(0)) / (x.std(0) + 1e-12)
    return _split("synthetic_classification", "classification", x, y, c, cfg)


def markov_chain(vocab_size: int, order: int, concentration: float, seed: int) -> np.ndarray:
    """Transition rows P[state, next] with state = the last ``order`` tokens (base V).

    Rows are Dirichlet(concentration) draws mixed with 2% of the uniform
    distribution, so every transition is possible (the chain is irreducible and
    aperiodic: a unique stationary distribution exists).
    """
    rng = np.random.default_rng([seed, 3])
    n_states = vocab_size ** order
    p = rng.dirichlet(np.full(vocab_size, concentration), size=n_states)
    return 0.98 * p + 0.02 / vocab_size


def stationary_distribution(p: np.ndarray, vocab_size: int, order: int) -> np.ndarray:
    """Stationary distribution over states (last ``order`` tokens) of chain ``p``."""
    n_states = p.shape[0]
    t = np.zeros((n_states, n_states))  # state -> state transition matrix
    for s in range(n_states):
        base = (s % vocab_size ** (order - 1)) * vocab_size  # drop the oldest token
        t[s, base:base + vocab_size] = p[s]
    # Solve pi (T - I) = 0 with sum(pi) = 1 (least squares on the stacked system).
    a = np.vstack([t.T - np.eye(n_states), np.ones((1, n_states))])
    rhs = np.zeros(n_states + 1)
    rhs[-1] = 1.0
    pi = np.linalg.lstsq(a, rhs, rcond=None)[0]
    pi = np.clip(pi, 0.0, None)
    pi /= pi.sum()
    if np.abs(pi @ t - pi).max() > 1e-10:
        raise RuntimeError("stationary distribution did not converge")  # cannot happen for p > 0
    return pi


def _entropy_rows(p: np.ndarray) -> np.ndarray:
    return -(p * np.log(p)).sum(axis=-1)


def markov_loss_floor(p: np.ndarray, pi: np.ndarray, vocab_size: int, order: int, seq_len: int) -> tuple[float, float]:
    """(floor, entropy_rate) in nats, for windows of ``seq_len`` targets.

    Sequences start in the stationary distribution, so every position has the same
    conditional entropy (the entropy rate sum_s pi(s) H(P[s])) once it sees
    ``order`` tokens of context. With order 2 the first target s1 sees only s0, so
    its conditional entropy is H(S1 | S0) = H(S0, S1) - H(S0) under pi.
    """
    rate = float(pi @ _entropy_rows(p))
    if order == 1:
        return rate, rate
    joint = pi.reshape(vocab_size, vocab_size)  # pi over (s0, s1)
    marg = joint.sum(axis=1)
    h_joint = -(joint * np.log(joint)).sum()
    h_marg = -(marg * np.log(marg)).sum()
    first = float(h_joint - h_marg)
    floor = (first + (seq_len - 1) * rate) / seq_len
    return floor, rate


def sample_markov(p: np.ndarray, pi: np.ndarray, vocab_size: int, order: int,
                  n: int, length: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` sequences of ``length`` tokens (int64), starting in the stationary state."""
    if length < order:
        raise DataError(f"data.seq_len: sequences need at least {order} tokens for a chain of order {order}")
    cdf_p = np.cumsum(p, axis=1)
    state = np.minimum(np.searchsorted(np.cumsum(pi), rng.random(n), side="right"), len(pi) - 1)
    seq = np.empty((n, length), dtype=np.int64)
    for j in range(order):  # unpack the start state (base V digits, oldest first)
        seq[:, j] = (state // vocab_size ** (order - 1 - j)) % vocab_size
    keep = vocab_size ** (order - 1)
    for t in range(order, length):
        u = rng.random(n)[:, None]
        nxt = np.minimum((cdf_p[state] < u).sum(axis=1), vocab_size - 1)
        seq[:, t] = nxt
        state = (state % keep) * vocab_size + nxt
    return seq


def make_markov_sequences(cfg) -> Dataset:
    """Sequences of ``seq_len + 1`` tokens; x = tokens[:-1], y = tokens[1:]."""
    v, k, t = cfg.vocab_size, cfg.markov_order, cfg.seq_len
    p = markov_chain(v, k, cfg.concentration, cfg.seed)
    pi = stationary_distribution(p, v, k)
    floor, rate = markov_loss_floor(p, pi, v, k, t)
    seq = sample_markov(p, pi, v, k, cfg.n_samples, t + 1, np.random.default_rng([cfg.seed, 4]))
    info = {"loss_floor": floor, "entropy_rate": rate, "uniform_loss": float(np.log(v))}
    return _split("synthetic_sequence", "sequence", seq[:, :-1].copy(), seq[:, 1:].copy(), v, cfg, info)
