"""Training and evaluation loops: next-token cross-entropy, AdamW, warmup then cosine decay.

Evaluation scores each target token by its kind (see :mod:`rope.experiment.data`):

* ``loss``: mean cross-entropy over every next-token target of the sequence;
* ``markov_loss``: over Markov tokens only (local structure; floor: the chain's entropy rate);
* ``recall_loss`` and ``recall_accuracy`` (argmax correct): over recall tokens only, which are
  predictable only by retrieving a span that may lie anywhere earlier in the context.

A method with ``per_prefix`` (dynamic NTK) is evaluated as it would run when generating: the
targets in each block of L positions ending at e are scored by a forward pass over the prefix
of e tokens with the scheme built for length e, so the scale grows with the context read so
far (with keys re-rotated at each block; the granularity is one block of L, not one token).
"""

from __future__ import annotations

import math
import sys

import torch
import torch.nn.functional as F

from .._checks import flag, integer, number
from .data import MARKOV, RECALL, RecallTask
from .methods import Context, Method, PositionScheme
from .model import TinyTransformer


def progress_bar(iterable, enabled: bool, description: str):
    """``iterable`` (a sized one: a range, a list) with its progress shown on stderr while it is run
    through, or ``iterable`` itself when not ``enabled``.

    The display is a tqdm bar, removed when done, if tqdm is installed (``pip install
    rope-derived[experiment]``); without tqdm it is a plain line at every tenth of the way
    (:class:`PlainProgress`). Either has ``set_postfix(**values)``, shown with the count.

    Args:
        iterable: a sized iterable (a range, a list).
        enabled: show the progress; else return ``iterable`` as it is.
        description: the label of the bar or line.
    """
    if not enabled:
        return iterable
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return PlainProgress(iterable, description)
    return tqdm(iterable, desc=description, leave=False)


class PlainProgress:
    """Progress without tqdm: iterates over ``iterable`` and writes ``description: done/total``, with
    the values of the last :meth:`set_postfix`, as a line on stderr after every tenth of the items
    and after the last.

    Args:
        iterable: a sized iterable.
        description: the label of each line.
    """

    def __init__(self, iterable, description: str):
        self.iterable, self.description, self.postfix = iterable, description, ""

    def __iter__(self):
        total = len(self.iterable)
        every = max(1, total // 10)
        for done, item in enumerate(self.iterable, start=1):
            yield item
            if done % every == 0 or done == total:
                print(f"{self.description}: {done}/{total}{self.postfix}", file=sys.stderr, flush=True)

    def set_postfix(self, **values) -> None:
        """Show ``name=value`` for each of ``values`` after the count from the next line on.

        Args:
            **values: the values to show, by name.
        """
        self.postfix = "".join(f", {name}={value}" for name, value in values.items())


def learning_rate_at(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warmup to ``peak`` over ``warmup`` steps, then cosine decay to peak / 10.

    Args:
        step: the step, counted from 0.
        steps: the number of steps of the run.
        peak: the largest learning rate.
        warmup: the number of warmup steps.
    """
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(
    model: TinyTransformer,
    scheme: PositionScheme,
    task: RecallTask,
    *,
    steps: int,
    batch_size: int,
    length: int,
    learning_rate: float,
    warmup_steps: int,
    weight_decay: float,
    data_seed: int,
    device: torch.device | str = "cpu",
    progress: bool = False,
    description: str = "train",
) -> list[float]:
    """Train ``model`` in place on fresh batches (batch i drawn with seed ``data_seed + i``);
    return the training loss of every step. A loss that is not finite (a learning rate or weight
    decay so large that the weights overflow) stops the training with ``ValueError`` naming them,
    rather than NaN results.

    Args:
        model: the model to train.
        scheme: its position scheme at the training length.
        task: the language the batches are drawn from.
        steps: the number of optimizer steps, >= 1.
        batch_size: the sequences per batch, >= 1.
        length: the tokens per sequence, >= 1.
        learning_rate: AdamW's peak learning rate (:func:`learning_rate_at`), > 0.
        warmup_steps: the steps of linear warmup, >= 0.
        weight_decay: AdamW's weight decay, >= 0.
        data_seed: the seed of the first batch, >= 0.
        device: the device the batches are moved to (the model's).
        progress: show the progress on stderr (:func:`progress_bar`).
        description: the progress bar's label.
    """
    steps, batch_size = integer("steps", steps, minimum=1), integer("batch_size", batch_size, minimum=1)
    length, warmup_steps = integer("length", length, minimum=1), integer("warmup_steps", warmup_steps, minimum=0)
    data_seed = integer("data_seed", data_seed, minimum=0)
    learning_rate = number("learning_rate", learning_rate, positive=True)
    weight_decay = number("weight_decay", weight_decay, minimum=0.0)
    flag("progress", progress)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, betas=(0.9, 0.98), weight_decay=weight_decay)
    losses = []
    model.train()
    bar = progress_bar(range(steps), progress, description)
    for step in bar:
        tokens, _ = task.sample(batch_size, length, data_seed + step)
        tokens = tokens.to(device)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate_at(step, steps, learning_rate, warmup_steps)
        logits = model(tokens, scheme)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if not math.isfinite(losses[-1]):  # every later step, and the results, would be NaN
            raise ValueError(f"training diverged: the loss of step {step} is {losses[-1]} (learning_rate "
                             f"{learning_rate}, weight_decay {weight_decay}); a smaller learning_rate trains")
        if progress and step % 20 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
    model.eval()
    return losses


def scored_logits(model: TinyTransformer, method: Method, ctx: Context, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token logits ``[n, length, vocab]`` for every position of ``tokens`` ``[n, length]``, as
    :func:`evaluate` scores them: one forward pass with ``method`` built for the length, or for a
    ``per_prefix`` method one pass per block of L positions (see the module docstring).

    Args:
        model: the trained model.
        method: the method whose scheme is used.
        ctx: the context of the model (its ``length`` is replaced by each pass's).
        tokens: int64 ``[n, length]``.
    """
    length = tokens.shape[1]
    if not method.per_prefix:
        return model(tokens, method.build(ctx.at(length)))
    pieces, start = [], 0
    while start < length:
        end = min(start + ctx.training_length, length)
        logits = model(tokens[:, :end], method.build(ctx.at(end)))
        pieces.append(logits[:, start:end])
        start = end
    return torch.cat(pieces, dim=1)


@torch.no_grad()
def evaluate(
    model: TinyTransformer,
    method: Method,
    ctx: Context,
    tokens: torch.Tensor,
    kinds: torch.Tensor,
    *,
    batch_size: int,
) -> dict[str, float]:
    """The metrics of the module docstring on ``tokens`` ``[n, length]`` with kinds ``kinds``.

    Args:
        model: the trained model.
        method: the method evaluated.
        ctx: the context of the model.
        tokens: int64 ``[n, length]``.
        kinds: the kinds of the tokens, int64 ``[n, length]``.
        batch_size: the sequences per forward pass, >= 1.

    Returns:
        ``{"loss", "markov_loss", "recall_loss", "recall_accuracy"}``, NaN where no target is of a kind.
    """
    batch_size = integer("batch_size", batch_size, minimum=1)
    model.eval()
    totals = {"all": 0.0, "markov": 0.0, "recall": 0.0, "correct": 0}
    counts = {"all": 0, "markov": 0, "recall": 0}
    for first in range(0, tokens.shape[0], batch_size):
        batch = tokens[first : first + batch_size]
        target_kinds = kinds[first : first + batch_size, 1:].to(batch.device)
        logits = scored_logits(model, method, ctx, batch)[:, :-1].double()
        targets = batch[:, 1:]
        nll = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
        correct = logits.argmax(-1) == targets
        totals["all"] += nll.sum().item()
        counts["all"] += nll.numel()
        for name, kind in (("markov", MARKOV), ("recall", RECALL)):
            mask = target_kinds == kind
            totals[name] += nll[mask].sum().item()
            counts[name] += int(mask.sum())
        totals["correct"] += int(correct[target_kinds == RECALL].sum())

    def mean(total, count):
        return total / count if count else math.nan

    return {
        "loss": mean(totals["all"], counts["all"]),
        "markov_loss": mean(totals["markov"], counts["markov"]),
        "recall_loss": mean(totals["recall"], counts["recall"]),
        "recall_accuracy": mean(totals["correct"], counts["recall"]),
    }
