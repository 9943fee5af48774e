"""FoPE, Fourier Position Embedding (Hua et al. 2024, "Fourier Position Embedding: Enhancing
Attention's Periodic Extension for Length Generalization", arXiv:2412.17739): RoPE whose pairs turn
by learned mixtures of the frequencies instead of one frequency each.

Definition, as the checkpoints that use it run (vLLM's ``FourierRotaryEmbedding``,
``vllm/model_executor/layers/rotary_embedding/fope.py``, https://github.com/vllm-project/vllm,
selected by the config key ``use_fope`` with ``num_inv_freq``, ``fope_sep_head`` and
``fope_init_factor``). FoPE keeps R of RoPE's frequencies theta_D = b^(-2D/d), D = 0 .. R - 1 (d
the rotary width; :func:`fope_inv_freq`: the first ``num_inv_freq``, or those above 2 pi / L, the
pairs that turn at least once over the context L = ``max_position_embeddings``). Each key head h
has learned coefficients ``cos_coef[h, D, j]`` and ``sin_coef[h, D, j]`` (``[heads_k, R, R]``; one
head shared by all when ``fope_sep_head`` is False). At position t, for j = 0 .. head_dim/2 - 1::

    C[t, h, j] = sum_D cos(t theta_D) cos_coef[h, D, j],
    S[t, h, j] = sum_D sin(t theta_D) sin_coef[h, D, j]

for j < R, and C = 1, S = 0 for R <= j < head_dim/2 (those coordinates pass through), and the head
x of key head h (query head q reads the tables of key head q // (heads_q / heads_k)) becomes, in the
half layout over the whole head (pair j is coordinates j and j + head_dim/2)::

    y_j = x_j C_j - x_{j + head_dim/2} S_j,
    y_{j + head_dim/2} = x_{j + head_dim/2} C_j + x_j S_j,

vLLM's ``x * cat(C, C) + rotate_neox(x) * cat(S, S)``. With identity coefficients this is RoPE over
the R retained pairs. ``fope_init_factor`` only initialises the coefficients for training; the
numbers at inference do not read it. Scores q . k then hold, per pair, several frequencies at
once (the paper's Fourier series), so FoPE is no frequency table: :func:`rope.inv_freq` refuses
the FoPE keys (:data:`rope.config.FOREIGN_KEYS`) and points here.

Accuracy. The angles t theta_D are reduced exactly (:func:`rope.apply.exact_cos_sin`: cos and sin
within 2^-52 at every int64 position); the tables are float64 sums of R products, and the
rotation is done in float64 and rounded once to the input dtype. With A_j = sum_D
``|cos_coef[h, D, j]|`` and B_j = sum_D ``|sin_coef[h, D, j]|``, each output is within half an
ulp of its dtype of the exact value plus (R + 4) 2^-53 (``|x_j|`` A_j + ``|x_{j + head_dim/2}|``
B_j) (tests/test_fope.py checks it against a float64 reference of exact angles). vLLM computes
the angles and the tables in float32 and rounds them to the model dtype before the products.

Gradients flow to q and k and to ``cos_coef`` and ``sin_coef`` (learned parameters): float64
autograd of the same operations, each gradient rounded once to its tensor's dtype. The
frequencies are constants (an ``inv_freq`` that requires grad is refused, as in
:func:`rope.apply_rotary`).

Range. For q and k in float16, bfloat16 or float32 and coefficients of those dtypes no float64
intermediate can overflow (products stay below 2^(128 + 128 + log2 R)), and an output beyond its
dtype's range is +-inf. float64 inputs or coefficients near float64's largest numbers may
overflow in the products (inf - inf = NaN): not guarded, unlike :func:`rope.apply_rotary`, whose
tables are bounded by 1.
"""

from __future__ import annotations

import math

import torch

from . import _checks
from .apply import check_inputs, exact_cos_sin, has_float64
from .config import MAX_LENGTH
from .frequencies import inv_freq
from .rotation import round_once


def fope_inv_freq(rope_theta: float, rotary_dim: int, *, num_inv_freq: int | None = None,
                  max_position_embeddings: int | None = None) -> torch.Tensor:
    """The R frequencies FoPE keeps, float32 ``[R]``: theta_D = b^(-2D/d), D = 0 .. d/2 - 1 (as
    :func:`rope.inv_freq` of the ``default`` type gives them, rounded once from float64), the
    first ``num_inv_freq`` of them or, without it, those above 2 pi / L, L =
    ``max_position_embeddings``: vLLM's ``FourierRotaryEmbedding._compute_inv_freq``, whose float32
    comparison is kept (theta_D > 2 pi / L rounded to float32). Where both are given,
    ``num_inv_freq`` decides, as in vLLM. (vLLM's own theta_D is a float32 power, which can differ
    from the correctly rounded one by an ulp.)

    Args:
        rope_theta: the base b, > 1.
        rotary_dim: the rotary width d, even, >= 2.
        num_inv_freq: R, in [1, d/2]; or ``None``.
        max_position_embeddings: L, in [1, 2^63], read where ``num_inv_freq`` is ``None``.

    Returns:
        float32 ``[R]``, the retained theta_D, decreasing.
    """
    rope_theta = _checks.number("rope_theta", rope_theta)  # a None would read as the default base here
    rotary_dim = _checks.integer("rotary_dim", rotary_dim, minimum=2, even=True)
    num_inv_freq = _checks.optional_integer("num_inv_freq", num_inv_freq, minimum=1, maximum=rotary_dim // 2)
    length = _checks.optional_integer("max_position_embeddings", max_position_embeddings, minimum=1,
                                      maximum=MAX_LENGTH)
    if num_inv_freq is None and length is None:
        raise ValueError("give num_inv_freq (how many frequencies FoPE keeps) or max_position_embeddings (it "
                         "keeps those above 2 pi / max_position_embeddings)")
    theta, _ = inv_freq({"rope_type": "default", "rope_theta": rope_theta}, rotary_dim)
    if num_inv_freq is not None:
        return theta[:num_inv_freq]
    kept = theta[theta > torch.tensor(2 * math.pi / length, dtype=torch.float32)]
    if not kept.numel():
        raise ValueError(f"max_position_embeddings = {length} keeps no frequency: FoPE keeps theta_D > 2 pi / "
                         f"max_position_embeddings, and theta_0 = 1 needs max_position_embeddings >= 7; give "
                         "num_inv_freq")
    return kept


class _Widen(torch.autograd.Function):
    """x as float64, with its gradient rounded once back to x's dtype."""

    @staticmethod
    def forward(ctx, x):
        ctx.dtype = x.dtype
        return x.to(torch.float64)

    @staticmethod
    def backward(ctx, grad):
        return round_once(grad, ctx.dtype)


def _widen(x: torch.Tensor) -> torch.Tensor:
    if x.dtype == torch.float64:
        return x
    if x.requires_grad and torch.is_grad_enabled():
        return _Widen.apply(x)
    return x.to(torch.float64)


def _check_coefficients(cos_coef, sin_coef, pairs: int, heads_k: int, sep_head: bool, q: torch.Tensor) -> None:
    """``cos_coef`` and ``sin_coef``: floating tensors of one shape [heads, R, R] on q's device,
    heads = heads_k (``sep_head``) or at least 1, finite (eagerly off CUDA)."""
    for name, coef in (("cos_coef", cos_coef), ("sin_coef", sin_coef)):
        _checks.float_tensor(name, coef)
        heads_ok = coef.dim() == 3 and (coef.shape[0] == heads_k if sep_head else coef.shape[0] >= 1)
        if not heads_ok or tuple(coef.shape[1:]) != (pairs, pairs):
            heads = f"heads_k = {heads_k}" if sep_head else "heads >= 1 (sep_head=False reads the first)"
            raise ValueError(f"{name} must have shape [heads, R, R] with {heads} and R = len(inv_freq) = {pairs}, "
                             f"got {tuple(coef.shape)}")
        _checks.same_device("q", q, **{name: coef})
    if cos_coef.dtype != sin_coef.dtype:
        raise TypeError(f"cos_coef and sin_coef must have the same dtype, got {cos_coef.dtype} and {sin_coef.dtype}")
    for name, coef in (("cos_coef", cos_coef), ("sin_coef", sin_coef)):
        _checks.assert_values(name, torch.isfinite(coef).all(), "finite values (no NaN or inf)")


def _rotate(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """x ``[batch, seq, heads, head_dim]`` turned by the tables ``[batch or 1, seq, H, head_dim/2]``
    (H = 1, or H key heads that each serve heads / H consecutive heads of x), float64, rounded once."""
    batch, seq, heads, head_dim = x.shape
    tables = c.shape[2]
    half = head_dim // 2
    x5 = _widen(x).reshape(batch, seq, tables, heads // tables if tables else 0, head_dim)
    c, s = c[:, :, :, None], s[:, :, :, None]
    a, b = x5[..., :half], x5[..., half:]
    y = torch.cat([a * c - b * s, b * c + a * s], dim=-1)
    return round_once(y.reshape(x.shape), x.dtype)


def apply_fope(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    cos_coef: torch.Tensor,
    sin_coef: torch.Tensor,
    sep_head: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q and k by FoPE (module docstring): pair j of a head of key head h at position t by
    the tables C[t, h, j] = sum_D cos(t theta_D) cos_coef[h, D, j] and S[t, h, j] = sum_D
    sin(t theta_D) sin_coef[h, D, j] (C = 1, S = 0 beyond the R retained pairs), half layout over
    the whole head: y_j = x_j C_j - x_{j + head_dim/2} S_j, y_{j + head_dim/2} =
    x_{j + head_dim/2} C_j + x_j S_j.

    Args:
        q: ``[batch, seq, heads_q, head_dim]``, float16, bfloat16, float32 or float64; head_dim even.
        k: ``[batch, seq, heads_k, head_dim]``, of q's dtype; heads_q a multiple of heads_k (query
            head q reads the tables of key head q // (heads_q / heads_k)).
        positions: integer positions, ``[seq]`` or ``[batch, seq]``, any int64 values.
        inv_freq: the R retained frequencies theta_D, 1 <= R <= head_dim/2, float32 or float64
            (:func:`fope_inv_freq`); constants to autograd.
        cos_coef: ``[heads_k, R, R]`` (``[H, R, R]``, H >= 1, with ``sep_head=False``), the learned
            cos coefficients, any floating dtype; may require grad.
        sin_coef: the sin coefficients, of cos_coef's shape and dtype.
        sep_head: vLLM's ``fope_sep_head``: True, key head h reads ``cos_coef[h]``; False, every head
            reads ``cos_coef[0]`` (vLLM's parameter holds heads_k of them and reads the first).

    Returns:
        ``(q_out, k_out)`` in q's dtype, each value rounded once from float64 (module docstring,
        "Accuracy"); differentiable in q, k, cos_coef and sin_coef.

    Raises:
        TypeError, ValueError: for any bad argument, naming it (README, "Errors").
    """
    _checks.head_tensors(q=q, k=k)
    _checks.tensor("inv_freq", inv_freq)
    head_dim = q.shape[3]
    if head_dim % 2:
        raise ValueError(f"head_dim must be even (FoPE pairs coordinate j with j + head_dim/2), got {head_dim}")
    if inv_freq.dim() == 1 and not 1 <= inv_freq.shape[0] <= head_dim // 2:
        raise ValueError(f"inv_freq must hold R frequencies, 1 <= R <= head_dim/2 = {head_dim // 2}, got "
                         f"{inv_freq.shape[0]}")
    check_inputs(q, k, positions, inv_freq, None)
    sep_head = _checks.flag("sep_head", sep_head)
    heads_q, heads_k = q.shape[2], k.shape[2]
    if heads_q % heads_k if heads_k else heads_q:
        raise ValueError(f"heads_q = {heads_q} must be a multiple of heads_k = {heads_k}: query head h reads the "
                         "tables of key head h // (heads_q / heads_k)")
    pairs = inv_freq.shape[0]
    _check_coefficients(cos_coef, sin_coef, pairs, heads_k, sep_head, q)
    if not has_float64(q.device):
        raise ValueError(f"FoPE sums its tables in float64, which q's device {q.device} lacks")
    rows = positions.reshape(*positions.shape[:-1] or (1,), positions.shape[-1])  # [batch or 1, seq]
    cos, sin = exact_cos_sin(rows, inv_freq)  # float64 [batch or 1, seq, R]
    if not sep_head:
        cos_coef, sin_coef = cos_coef[:1], sin_coef[:1]
    c = torch.einsum("bsd,hdj->bshj", cos, _widen(cos_coef))
    s = torch.einsum("bsd,hdj->bshj", sin, _widen(sin_coef))
    rest = (*c.shape[:-1], head_dim // 2 - pairs)  # pairs past R: C = 1, S = 0, unrotated
    c = torch.cat([c, torch.ones(rest, dtype=torch.float64, device=c.device)], dim=-1)
    s = torch.cat([s, torch.zeros(rest, dtype=torch.float64, device=s.device)], dim=-1)
    return _rotate(q, c, s), _rotate(k, c, s)
