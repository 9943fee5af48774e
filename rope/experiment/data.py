"""Synthetic language with local and long-range structure: a Markov chain plus keyed recall.

Every sequence is generated left to right from three kinds of token:

* **Markov tokens** (ids ``0 .. markov_vocab - 1``): the next token of a fixed random Markov chain.
  Each chain state has ``successors`` possible next states with Dirichlet(1) weights, so a model
  that has learned the transition table reaches the chain's entropy rate, the floor of the
  *local* loss, at every position and every length.
* **Anchor tokens** (ids ``markov_vocab .. markov_vocab + anchors - 1``): with probability
  ``event_rate`` at each step outside a span, an anchor starts an event. A *new* anchor (one not
  yet used in this sequence) is followed by ``span`` Markov tokens, its *source span*. A
  *recalled* anchor (one already used) is followed by an exact copy of its source span.
* **Recall tokens**: the copied span. They are determined by the context, but only through a
  token that may lie anywhere earlier in the sequence, so predicting them is a long-range
  retrieval (an induction-head task). Their distance grows with the sequence length: at 16x the
  training length the source lies, on average, far beyond any offset seen in training.

The chain continues through events: the state after a span is its last token, and anchors are
not chain states. The labels returned with each sequence say which kind every token is, so the
evaluation can score the local and the long-range parts separately.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch

from .._checks import integer, number

MARKOV, ANCHOR, RECALL = 0, 1, 2
KIND_NAMES = {MARKOV: "markov", ANCHOR: "anchor", RECALL: "recall"}


@dataclass(frozen=True)
class TaskSpec:
    """The parameters of the synthetic language (see the module docstring).

    Args:
        markov_vocab: the number of Markov tokens (chain states), >= 2.
        successors: the possible next states of each chain state, in [1, markov_vocab].
        anchors: the number of anchor tokens, >= 1.
        span: the tokens after an anchor: its source span, or the copy of it.
        event_rate: the probability, at each step outside a span, that an anchor starts an event.
        recall_share: the probability that an event recalls a used anchor rather than using a new
            one, where both are possible.
        seed: the seed of the transition table, >= 0.
    """

    markov_vocab: int = 48
    successors: int = 4
    anchors: int = 64
    span: int = 4
    event_rate: float = 0.125
    recall_share: float = 0.5
    seed: int = 0

    def __post_init__(self):
        """Checks every field and stores NumPy integers as ints (the spec is written to JSON)."""
        for name, minimum in (("markov_vocab", 2), ("successors", 1), ("anchors", 1), ("span", 1), ("seed", 0)):
            object.__setattr__(self, name, integer(name, getattr(self, name), minimum=minimum))
        for name in ("event_rate", "recall_share"):
            object.__setattr__(self, name, number(name, getattr(self, name), minimum=0.0, maximum=1.0))
        if self.successors > self.markov_vocab:
            raise ValueError(f"successors must be <= markov_vocab = {self.markov_vocab}, got {self.successors}")

    @property
    def vocab_size(self) -> int:
        return self.markov_vocab + self.anchors

    def to_dict(self) -> dict:
        return asdict(self)


class RecallTask:
    """The language of a :class:`TaskSpec`: its fixed transition table and a sampler.

    Args:
        spec: the parameters of the language.
    """

    def __init__(self, spec: TaskSpec):
        if not isinstance(spec, TaskSpec):
            raise TypeError(f"spec must be a TaskSpec, got {type(spec).__name__}")
        self.spec = spec
        rng = np.random.default_rng(spec.seed)
        m = spec.markov_vocab
        self.transitions = np.zeros((m, m))
        for state in range(m):
            successors = rng.choice(m, size=spec.successors, replace=False)
            self.transitions[state, successors] = rng.dirichlet(np.ones(spec.successors))
        self._cdf = np.cumsum(self.transitions, axis=1)
        self._cdf[:, -1] = 1.0

    def stationary_distribution(self) -> np.ndarray:
        """pi with pi P = pi, from the eigenvector of P^T for eigenvalue 1."""
        values, vectors = np.linalg.eig(self.transitions.T)
        pi = np.real(vectors[:, np.argmin(np.abs(values - 1))])
        return pi / pi.sum()

    def entropy_rate(self) -> float:
        """H = -sum_a pi_a sum_b P_ab ln P_ab (nats): the best possible loss on Markov tokens."""
        p = self.transitions
        logs = np.log(np.where(p > 0, p, 1.0))
        return float(-(self.stationary_distribution() @ (p * logs).sum(axis=1)))

    def greedy_chain_accuracy(self) -> float:
        """sum_a pi_a max_b P_ab: how often the most likely successor of a chain token is the next one.

        A model that ignores the far context and predicts recall tokens from the chain alone gets
        about this accuracy on them (a little less on the first token of a span, whose chain
        predecessor is the anchor's source, not the token before it).
        """
        return float(self.stationary_distribution() @ self.transitions.max(axis=1))

    def chain_only_recall_accuracy(self, tokens: torch.Tensor, kinds: torch.Tensor) -> float:
        """Accuracy on the recall tokens of a sample of a predictor that never looks back further
        than the last chain token: argmax_b P[state, b], state the last non-anchor token before.

        Args:
            tokens: a sample's tokens, int64 ``[batch, length]`` (:meth:`sample`).
            kinds: their kinds, int64 ``[batch, length]``.

        Returns:
            The accuracy, NaN where the sample has no recall token.
        """
        correct = total = 0
        for row, row_kinds in zip(tokens.tolist(), kinds.tolist()):
            state = None
            for token, kind in zip(row, row_kinds):
                if kind == RECALL and state is not None:
                    correct += int(np.argmax(self.transitions[state]) == token)
                    total += 1
                if kind != ANCHOR:
                    state = token
        return correct / total if total else math.nan

    def sample(self, batch: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``batch`` sequences of ``length`` tokens and their kinds, both int64 ``[batch, length]``.

        Deterministic in ``seed``; all sequences are generated together, one position at a time.

        Args:
            batch: the number of sequences, >= 1.
            length: the tokens per sequence, >= 1.
            seed: the sample's seed, >= 0 (with the spec's seed).

        Returns:
            ``(tokens, kinds)``, kinds ``MARKOV``, ``ANCHOR`` or ``RECALL`` (0, 1, 2).
        """
        batch = integer("batch", batch, minimum=1)
        length = integer("length", length, minimum=1)
        seed = integer("seed", seed, minimum=0)
        spec = self.spec
        rng = np.random.default_rng([spec.seed, seed])
        rows = np.arange(batch)
        tokens = np.zeros((batch, length), dtype=np.int64)
        kinds = np.zeros((batch, length), dtype=np.int64)
        state = rng.integers(spec.markov_vocab, size=batch)  # current Markov chain state
        span_left = np.zeros(batch, dtype=np.int64)  # tokens still to come in the current span
        copy_from = np.full(batch, -1)  # next source index while copying, else -1
        anchor_at = np.full((batch, spec.anchors), -1)  # position of each used anchor

        for t in range(length):
            markov_next = (rng.random(batch)[:, None] > self._cdf[state]).sum(axis=1)
            event = (span_left == 0) & (rng.random(batch) < spec.event_rate)
            used = anchor_at >= 0
            any_used, any_free = used.any(axis=1), (~used).any(axis=1)
            recall = event & any_used & ((rng.random(batch) < spec.recall_share) | ~any_free)
            new = event & ~recall & any_free
            scores = rng.random((batch, spec.anchors))
            pick_new = np.argmax(np.where(used, -1.0, scores), axis=1)
            pick_old = np.argmax(np.where(used, scores, -1.0), axis=1)

            copying = (span_left > 0) & (copy_from >= 0)
            copied = tokens[rows, np.maximum(copy_from, 0)]
            token = np.where(copying, copied, markov_next)
            kind = np.where(copying, RECALL, MARKOV)
            anchor = np.where(new, pick_new, pick_old)
            starts = new | recall
            token = np.where(starts, spec.markov_vocab + anchor, token)
            kind = np.where(starts, ANCHOR, kind)

            chain = ~starts
            state = np.where(chain, token, state)
            copy_from = np.where(copying, copy_from + 1, copy_from)
            span_left = np.where(chain & (span_left > 0), span_left - 1, span_left)
            copy_from = np.where(span_left == 0, -1, copy_from)
            copy_from = np.where(recall, anchor_at[rows, pick_old] + 1, copy_from)
            anchor_at[rows[new], pick_new[new]] = t
            span_left = np.where(starts, spec.span, span_left)
            tokens[:, t], kinds[:, t] = token, kind
        return torch.from_numpy(tokens), torch.from_numpy(kinds)


def recall_distances(tokens: torch.Tensor, kinds: torch.Tensor) -> torch.Tensor:
    """For every recall token, the distance back to the token it copies (float64, 1-D).

    Args:
        tokens: a sample's tokens, int64 ``[batch, length]`` (:meth:`RecallTask.sample`).
        kinds: their kinds, int64 ``[batch, length]``.
    """
    distances = []
    for row_tokens, row_kinds in zip(tokens.tolist(), kinds.tolist()):
        first_seen, source = {}, None
        for t, (token, kind) in enumerate(zip(row_tokens, row_kinds)):
            if kind == ANCHOR:
                source = first_seen.get(token)
                first_seen.setdefault(token, t)
                offset = 0
            elif kind == RECALL:
                offset += 1
                distances.append(t - (source + offset))
    return torch.tensor(distances, dtype=torch.float64)


def describe(task: RecallTask, length: int, batch: int = 64, seed: int = 1) -> dict:
    """Token shares and recall distances of a sample: what the evaluation at ``length`` measures.

    Args:
        task: the language.
        length: the tokens per sequence.
        batch: the number of sequences sampled.
        seed: the sample's seed.

    Returns:
        ``{"length", "share" (per kind name), "mean_recall_distance", "max_recall_distance"}``.
    """
    tokens, kinds = task.sample(batch, length, seed)
    distances = recall_distances(tokens, kinds)
    shares = {name: float((kinds == kind).double().mean()) for kind, name in KIND_NAMES.items()}
    return {
        "length": length,
        "share": shares,
        "mean_recall_distance": float(distances.mean()) if len(distances) else math.nan,
        "max_recall_distance": float(distances.max()) if len(distances) else math.nan,
    }
