"""Dynamic NTK scaling with a KV cache: cache keys before rotation, or they go stale.

Dynamic NTK (emozilla, 2023; ``rope_type="dynamic"`` in :mod:`rope.frequencies`) recomputes the
base from the current length l = max(position) + 1 once l exceeds max_position_embeddings L::

    b(l) = b * (s * l / L - (s - 1))^(d / (d - 2)),     theta_i(l) = b(l)^(-2i/d).

Run on the whole sequence at once, every query and key is rotated with theta(l) of the full
length, and the logit of query m and key n depends on m - n only. Decoding with a cache
that stores keys *after* rotation (as transformers does) freezes key n at the frequencies of
the step that produced it, theta(l_n), while the new query uses theta(l): the logit becomes
``q^T R_m(theta(l))^T R_n(theta(l_n)) k``, which is no longer a function of m - n alone and
differs from the no-cache forward pass as soon as the base has moved (transformers issue
#25104, "Inconsistent Rotation Base for Dynamic NTK Scaling RoPE"; in PR #24653 bloc97 noted
that the correct way is to cache keys before rotation). Storing keys *before* rotation and
rotating all of them with the current theta(l) at every step reproduces the no-cache logits
exactly, at the price of re-rotating the whole cache each step.

:class:`DynamicNTKKeyCache` implements both choices; :func:`dynamic_ntk_scores` is the
no-cache reference. Everything is float64 and unscaled (no 1/sqrt(d), no mask).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .._checks import choice, head_tensors, integer, integer_tensor
from ..apply import apply_rotary
from ..config import MAX_LENGTH, RopeConfig, parse_config
from ..frequencies import inv_freq
from ..layouts import check_layout
from .rerope import check_qk, rotary_scores

STORES = ("unrotated", "rotated")


def _dynamic_config(config: Mapping[str, Any] | RopeConfig) -> RopeConfig:
    cfg = parse_config(config)  # a dynamic config needs factor and max_position_embeddings
    if cfg.rope_type != "dynamic":
        raise ValueError(f"config must have rope_type 'dynamic', got {cfg.rope_type!r}")
    return cfg


def _check_head_dim(q, k, head_dim: int) -> None:
    """q and k are ``[batch, seq, heads, head_dim]`` float tensors of the ``head_dim`` the frequencies
    are computed for: a smaller one would be refused as a rotary_dim beyond it, naming inv_freq, which
    the caller never passed; a larger one rotated with another head size's frequencies, silently."""
    head_tensors(q=q, k=k)
    for name, t in dict(q=q, k=k).items():
        if t.shape[3] != head_dim:
            raise ValueError(f"q and k must have head_dim {head_dim}, got {name} {tuple(t.shape)}")


def check_positions(**positions: torch.Tensor) -> None:
    """Refuse token positions dynamic NTK cannot count: each keyword must be a 1-D integer tensor
    (``TypeError``/``ValueError`` naming it) of positions >= 0 (``ValueError``): the length
    l = max(position) + 1 counts the tokens from position 0, as transformers' ``seq_len``, so a
    negative position has no length to scale for.

    Args:
        **positions: the tensors to check, each named by its keyword.
    """
    for name, p in positions.items():
        integer_tensor(name, p, dim=1)
        if p.numel() and (lowest := int(p.min())) < 0:
            raise ValueError(f"{name} must hold positions >= 0 (dynamic NTK's length max(position) + 1 counts "
                             f"tokens from position 0), got {lowest}")


def current_length(*positions: torch.Tensor) -> int:
    """l = max(position) + 1 over all tokens seen, the length dynamic NTK scales for (as transformers);
    1 when no token has been seen (every l <= max_position_embeddings gives the unscaled frequencies).
    Each argument is checked as :func:`check_positions` checks it (a 1-D integer tensor of positions
    >= 0), named ``positions[i]``.

    Args:
        *positions: 1-D integer tensors of the positions seen, each >= 0.
    """
    check_positions(**{f"positions[{i}]": p for i, p in enumerate(positions)})
    return _length(*positions)


def _length(*positions: torch.Tensor) -> int:
    """:func:`current_length` of positions already checked (one check per call)."""
    return max((int(p.max()) for p in positions if p.numel()), default=0) + 1


def dynamic_ntk_scores(q, k, q_positions, k_positions, config, head_dim: int, *, layout: str = "half") -> torch.Tensor:
    """No-cache reference: rotate every query and key with theta(l), l = max position + 1,
    and return the logits, float64 ``[batch, heads_q, q_len, k_len]``.

    ``head_dim`` is q's and k's (the frequencies are those of :func:`rope.inv_freq` for it;
    ``ValueError`` otherwise); positions are 1-D integer tensors of positions >= 0
    (:func:`check_positions`). No query or no key gives the empty logits, as
    :func:`.rerope.rotary_scores` does; with no token at all, l is 1 (:func:`current_length`).

    Args:
        q: queries ``[batch, q_len, heads_q, head_dim]``.
        k: keys ``[batch, k_len, heads_k, head_dim]``.
        q_positions: the queries' positions ``[q_len]``, integers >= 0.
        k_positions: the keys' positions ``[k_len]``, integers >= 0.
        config: a ``rope_parameters`` mapping or :class:`rope.RopeConfig` of rope_type ``dynamic``.
        head_dim: q's and k's head dimension.
        layout: ``"half"`` or ``"interleaved"``.
    """
    cfg = _dynamic_config(config)
    head_dim = integer("head_dim", head_dim, minimum=1)
    _check_head_dim(q, k, head_dim)
    check_positions(q_positions=q_positions, k_positions=k_positions)
    theta, _ = inv_freq(cfg, head_dim, seq_len=_length(q_positions, k_positions))
    return rotary_scores(q, k, q_positions, k_positions, theta, layout=layout)


class DynamicNTKKeyCache:
    """The keys of one attention layer under dynamic NTK scaling, cached one way or the other.

    ``store="unrotated"`` keeps raw keys and rotates all of them with the current frequencies at
    every step (equal to :func:`dynamic_ntk_scores`); ``store="rotated"`` rotates each key once,
    with the frequencies of the step that appended it, and keeps the result (the transformers
    behaviour, stale once the base has grown).

    Example::

        cache = DynamicNTKKeyCache({"rope_type": "dynamic", "factor": 4.0,
                                    "max_position_embeddings": 2048}, head_dim=128)
        scores = cache.step(q, k, positions)   # prefill, then one token at a time

    Args:
        config: a ``rope_parameters`` mapping or :class:`rope.RopeConfig` of rope_type ``dynamic``.
        head_dim: the head dimension of the queries and keys.
        store: ``"unrotated"`` or ``"rotated"`` keys, as above.
        layout: ``"half"`` or ``"interleaved"``.
    """

    def __init__(self, config: Mapping[str, Any] | RopeConfig, head_dim: int, *, store: str = "unrotated",
                 layout: str = "half"):
        self.config = _dynamic_config(config)
        self.head_dim = integer("head_dim", head_dim, minimum=1)
        choice("store", store, STORES)
        check_layout(layout)
        self.store = store
        self.layout = layout
        self.frequencies(self.config.max_position_embeddings)  # refuses a head_dim or config it cannot serve
        self.keys: torch.Tensor | None = None  # float64 [batch, cached, heads_k, head_dim]
        self.positions = torch.zeros(0, dtype=torch.int64)

    def frequencies(self, length: int) -> torch.Tensor:
        """theta(l) for the current length l, an int in [1, 2^63] (the length of any int64 positions
        from 0, :data:`rope.config.MAX_LENGTH`).

        Args:
            length: the current length l.
        """
        length = integer("length", length, minimum=1, maximum=MAX_LENGTH)
        return inv_freq(self.config, self.head_dim, seq_len=length)[0]

    def step(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Append the new keys ``k`` ``[batch, seq, heads_k, head_dim]`` at integer ``positions``
        ``[seq]`` and return the logits of the new queries ``q`` (same tokens) against every
        cached key, float64 ``[batch, heads_q, seq, cached]``. Everything stays on q's device:
        the positions (moved there), the frequencies and the cache, which then holds that
        device's keys. Positions are >= 0 (:func:`check_positions`), at least one.

        Args:
            q: the new queries ``[batch, seq, heads_q, head_dim]``.
            k: the new keys ``[batch, seq, heads_k, head_dim]``.
            positions: the new tokens' positions ``[seq]``, integers >= 0.
        """
        _check_head_dim(q, k, self.head_dim)
        check_positions(positions=positions)
        if positions.numel() == 0:
            raise ValueError("positions must hold at least one token")
        device = q.device
        positions = positions.to(device, torch.int64)
        cached = self.positions.to(device)
        theta = self.frequencies(_length(cached, positions)).to(device)  # both checked: when appended, above
        check_qk(q, k, positions, positions, theta)
        if self.keys is not None and self.keys.device != device:
            raise ValueError(f"q is on {device}, but the cached keys are on {self.keys.device}: a cache serves "
                             "one device")
        if self.keys is not None and (k.shape[0], k.shape[2]) != (self.keys.shape[0], self.keys.shape[2]):
            raise ValueError(f"k {tuple(k.shape)} does not match the cached keys {tuple(self.keys.shape)} "
                             "in batch or heads")
        new_keys = k.to(torch.float64)
        if self.store == "rotated":
            new_keys = _rotate(new_keys, positions, theta, self.layout)
        self.keys = new_keys if self.keys is None else torch.cat([self.keys, new_keys], dim=1)
        self.positions = torch.cat([cached, positions])
        if self.store == "unrotated":
            return rotary_scores(q, self.keys, positions, self.positions, theta, layout=self.layout)
        q_rotated = _rotate(q.to(torch.float64), positions, theta, self.layout)
        k_shared = self.keys.repeat_interleave(q.shape[2] // self.keys.shape[2], dim=2)
        return torch.einsum("bihd,bjhd->bhij", q_rotated, k_shared)


def _rotate(x: torch.Tensor, positions: torch.Tensor, theta: torch.Tensor, layout: str) -> torch.Tensor:
    """R_m(theta) x per token, float64 (apply_rotary on the torch path)."""
    return apply_rotary(x, x, positions.to(x.device), theta.to(x.device), layout=layout, backend="torch")[0]
