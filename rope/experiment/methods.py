"""The position schemes compared by the extrapolation experiment, and the method registry.

A *scheme* turns the per-head queries and keys ``[batch, seq, heads, head_dim]`` of one layer
into scaled attention logits ``[batch, heads, seq, seq]`` (before the causal mask). A *method*
says which trained model it runs on and builds its scheme for a context of ``length`` tokens,
given the training length L. With s = max(1, length / L), the frequency methods use these
``rope.inv_freq`` configs (theta_i = b^(-2i/d), i = 0 .. d/2 - 1, b = ``rope_theta``):

==================  =====================================================================
``rope``            ``default``: RoPE as trained, positions past L are extrapolated
``pi``              ``linear``, factor s: theta_i / s (Chen et al. 2023)
``ntk``             ``ntk_aware``, factor s: base b s^(d/(d-2)) (bloc97 2023)
``dynamic_ntk``     ``dynamic``, factor 1: base b (l/L)^(d/(d-2)) with l the length of the
                    prefix being read (emozilla 2023); evaluated prefix by prefix
``ntk_by_parts``    ``yarn`` with ``attention_factor`` 1: the per-pair ramp of YaRN alone
``yarn``            ``yarn``, factor s: the ramp plus the temperature (0.1 ln s + 1)^2 on the
                    logits (Peng et al. 2023)
``llama3``          ``llama3``, factor s, low/high frequency factors 1 and 4 (Llama 3.1)
==================  =====================================================================

The attention-side methods run on the same RoPE model: ``rerope`` and ``leaky_rerope`` compute
q^T R_{r'} k with the rectified relative position r' of :func:`rope.attention.rerope.rerope_positions`
in Su's inference-time two-pass form (:func:`rope.attention.rerope.rerope_scores_two_pass`)
(Su 2023), window w = L/2 and, for the leaky form, slope 1/k with k = max(1, (length - w) / (L - w)),
which maps the largest distance length - 1 just inside the trained range (and is plain RoPE up
to L). They attend in O(seq) memory, with RoPE inside attention (:class:`ReRoPE`), so they are
also evaluated at the config's longer ``long_eval_multiples``; ``logn`` multiplies the
logits of the query at position m by max(1, ln(m + 1) / ln L) (:func:`rope.attention.logn.logn_scale`), a
factor that is exactly 1 during training, so the RoPE model needs no separate training for it.
``alibi`` and ``nope`` are models trained with an ALiBi bias (:func:`rope.attention.encodings.alibi_bias`)
and with no position information at all. ``pi_finetuned`` and ``yarn_finetuned`` are copies of
the RoPE model fine-tuned at ``finetune_factor`` times L with PI and YaRN at that fixed factor,
and evaluated with it at every length, as a deployed fine-tuned model would be.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from ..attention import encodings
from ..frequencies import inv_freq
from ..hf import apply_rotary_pos_emb, rotate_half_tables


class PositionScheme:
    """Maps q, k ``[batch, seq, heads, head_dim]`` and positions ``[seq]`` to logits ``[batch, heads, seq, seq]``,
    and q, k, v to the causal attention output ``[batch, seq, heads, head_dim]``."""

    def logits(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """sum_n softmax_n(a_mn) v_n over the keys n <= m, from the whole seq x seq matrix of :meth:`logits`.

        Args:
            q: queries ``[batch, seq, heads, head_dim]``.
            k: keys ``[batch, seq, heads, head_dim]``.
            v: values ``[batch, seq, heads, head_dim]``.
            positions: the tokens' positions ``[seq]``.
        """
        seq = q.shape[1]
        logits = self.logits(q, k, positions)  # [batch, heads, seq, seq], scaled by 1/sqrt(head_dim)
        future = torch.ones(seq, seq, dtype=torch.bool, device=q.device).triu(1)
        weights = logits.masked_fill(future, float("-inf")).softmax(dim=-1)
        return torch.einsum("bhmn,bnhd->bmhd", weights, v)


def _dot(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q_m . k_n / sqrt(head_dim), ``[batch, heads, seq_q, seq_k]``."""
    return torch.einsum("bmhd,bnhd->bhmn", q, k) / math.sqrt(q.shape[-1])


class NoPosition(PositionScheme):
    """NoPE: a_mn = q_m . k_n / sqrt(d); only the causal mask distinguishes positions."""

    def logits(self, q, k, positions):
        return _dot(q, k)


class Rotary(PositionScheme):
    """RoPE: a_mn = (R_m q_m) . (R_n k_n) / sqrt(d) with frequencies ``inv_freq`` (half layout);
    ``attention_factor`` multiplies cos and sin, so the logits by its square (YaRN's 1/t).

    The cos and sin tables of :func:`rope.hf.rotate_half_tables` (float64 angles, rounded once to
    the model's dtype) are applied by :func:`rope.hf.apply_rotary_pos_emb`'s table formula
    ``x cos + rotate_half(x) sin``, as models are trained (the float64 rotation of
    :func:`rope.apply_rotary` doubled the training time of this small model).

    Args:
        frequencies: the frequencies theta_i ``[head_dim / 2]``.
        attention_factor: multiplies cos and sin.
    """

    def __init__(self, frequencies: torch.Tensor, attention_factor: float = 1.0):
        self.frequencies = frequencies
        self.attention_factor = attention_factor

    def logits(self, q, k, positions):
        cos, sin = rotate_half_tables(positions, self.frequencies.to(q.device), self.attention_factor, q.dtype)
        q, k = apply_rotary_pos_emb(q, k, cos[None], sin[None], unsqueeze_dim=2)  # q, k: [batch, seq, heads, dim]
        return _dot(q, k)


class LogN(Rotary):
    """RoPE logits of the query at position m times max(1, ln(m + 1) / ln L) (log-n scaling).

    Args:
        frequencies: the frequencies theta_i ``[head_dim / 2]``.
        training_length: L, the training length.
    """

    def __init__(self, frequencies: torch.Tensor, training_length: int):
        super().__init__(frequencies)
        self.training_length = training_length

    def logits(self, q, k, positions):
        from ..attention.logn import logn_scale

        scale = logn_scale(positions, self.training_length).to(device=q.device, dtype=q.dtype)
        return super().logits(q, k, positions) * scale[:, None]


BLOCK_SIZE = 256
"""Tile size of the blockwise path: fewer Python-level tiles than 128, no slower per token than 512 on CPU."""


class ReRoPE(PositionScheme):
    """Causal attention over q_m^T R_{r'} k_n / sqrt(d), ReRoPE's rectified relative position r'
    (``leaky_scale`` None is ReRoPE, a number k > 1 is Leaky ReRoPE), in O(seq) memory: RoPE inside
    attention, q and k rotated tile by tile and the seq x seq logits never formed.

    On CUDA the fused Triton kernel (:func:`rope.kernels.attention_operators.fused_rotary_attention`,
    float32 frequencies), elsewhere the blockwise float64 operator
    (:func:`rope.attention.blockwise.rotary_attention`) rounded once to the dtype of q; both compute
    the logits of Su's two-pass form (:func:`rope.attention.rerope.rerope_scores_two_pass`), whose
    two float64 seq x seq matrices per head bounded the evaluation length before.

    Args:
        frequencies: the frequencies theta_i ``[head_dim / 2]``.
        window: the window w.
        leaky_scale: Leaky ReRoPE's k, or ``None`` for ReRoPE.
    """

    def __init__(self, frequencies: torch.Tensor, window: int, leaky_scale: float | None = None):
        self.frequencies = frequencies
        self.window = window
        self.leaky_scale = leaky_scale

    def attend(self, q, k, v, positions):
        options = {"layout": "half", "causal": True, "window": self.window, "leaky_scale": self.leaky_scale}
        positions = positions.to(q.device)
        if uses_kernel(q.device):
            from ..kernels.attention_operators import fused_rotary_attention

            frequencies = self.frequencies.to(device=q.device, dtype=torch.float32)
            return fused_rotary_attention(q, k, v, positions, positions, frequencies, **options)
        from ..attention.blockwise import rotary_attention

        # the exact float64 path, whatever q's dtype: the committed runs were computed by it
        out = rotary_attention(q, k, v, positions, positions, self.frequencies.to(q.device),
                               block_size=BLOCK_SIZE, compute_dtype=torch.float64, **options)
        return out.to(q.dtype)


def uses_kernel(device: torch.device) -> bool:
    """Whether :class:`ReRoPE` attends with the Triton kernel on ``device``: on CUDA, where Triton compiles it.

    Args:
        device: the device of the queries.
    """
    return device.type == "cuda"


class Alibi(PositionScheme):
    """ALiBi: a_mn = q_m . k_n / sqrt(d) - slope_h ``|m - n|`` (Press et al. 2022).

    Args:
        num_heads: the number of heads, one slope each (:func:`rope.attention.encodings.alibi_slopes`).
    """

    def __init__(self, num_heads: int):
        self.slopes = encodings.alibi_slopes(num_heads)

    def logits(self, q, k, positions):
        bias = encodings.alibi_bias(positions, positions, self.slopes.to(q.device)).to(q.dtype)
        return _dot(q, k) + bias


@dataclass(frozen=True)
class Context:
    """What a method needs to build its scheme for a context of ``length`` tokens.

    Args:
        length: the context length the scheme is built for.
        training_length: L, the length the model was trained at.
        head_dim: the model's head dimension.
        num_heads: the model's heads per layer.
        rope_theta: the base b of the frequencies.
        finetune_factor: the fixed factor of the fine-tuned methods.
    """

    length: int
    training_length: int
    head_dim: int
    num_heads: int
    rope_theta: float
    finetune_factor: float

    @property
    def factor(self) -> float:
        """s = max(1, length / L)."""
        return max(1.0, self.length / self.training_length)

    def at(self, length: int) -> Context:
        return replace(self, length=length)


def _rotary(config: Callable[[Context], dict], *, seq_len: bool = False) -> Callable[[Context], PositionScheme]:
    def build(ctx: Context) -> PositionScheme:
        full = {"rope_theta": ctx.rope_theta, **config(ctx)}
        frequencies, attention = inv_freq(full, ctx.head_dim, seq_len=ctx.length if seq_len else None)
        return Rotary(frequencies, attention)

    return build


def _default_frequencies(ctx: Context) -> torch.Tensor:
    return inv_freq({"rope_type": "default", "rope_theta": ctx.rope_theta}, ctx.head_dim)[0]


def _yarn_config(factor: float, ctx: Context, **extra) -> dict:
    return {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": ctx.training_length, **extra}


def _leaky_scale(ctx: Context) -> float:
    """k = (length - w) / (L - w), at least 1 (k = 1 is plain RoPE): r' = w + (r - w) / k < L for r < length."""
    window = ctx.training_length // 2
    return max(1.0, (ctx.length - window) / (ctx.training_length - window))


@dataclass(frozen=True)
class Method:
    """A row of the results table: the model it runs on and its scheme at each length.

    Args:
        name: the method's key in :data:`METHODS`.
        label: its name in tables and plots.
        model: the trained model it runs on (``"rope"``, ``"alibi"``, ``"nope"``, ``"pi_finetuned"``,
            ``"yarn_finetuned"``).
        build: builds the scheme from a :class:`Context`.
        per_prefix: evaluated prefix by prefix, each at its own length (dynamic NTK).
        linear_memory: attends in O(seq) memory: evaluated at the ``long_eval_multiples`` too.
    """

    name: str
    label: str
    model: str
    build: Callable[[Context], PositionScheme]
    per_prefix: bool = False
    linear_memory: bool = False  # attends in O(seq) memory: evaluated at the long_eval_multiples too


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("rope", "RoPE, no scaling", "rope", _rotary(lambda c: {"rope_type": "default"})),
        Method("pi", "PI", "rope", _rotary(lambda c: {"rope_type": "linear", "factor": c.factor})),
        Method("ntk", "NTK-aware", "rope", _rotary(lambda c: {"rope_type": "ntk_aware", "factor": c.factor})),
        Method(
            "dynamic_ntk", "Dynamic NTK", "rope",
            _rotary(lambda c: {"rope_type": "dynamic", "factor": 1.0, "max_position_embeddings": c.training_length},
                    seq_len=True),
            per_prefix=True,
        ),
        Method("ntk_by_parts", "NTK-by-parts", "rope",
               _rotary(lambda c: _yarn_config(c.factor, c, attention_factor=1.0))),
        Method("yarn", "YaRN", "rope", _rotary(lambda c: _yarn_config(c.factor, c))),
        Method(
            "llama3", "Llama 3", "rope",
            _rotary(lambda c: {"rope_type": "llama3", "factor": c.factor, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": c.training_length}),
        ),
        Method("rerope", "ReRoPE", "rope",
               lambda c: ReRoPE(_default_frequencies(c), c.training_length // 2), linear_memory=True),
        Method("leaky_rerope", "Leaky ReRoPE", "rope",
               lambda c: ReRoPE(_default_frequencies(c), c.training_length // 2, _leaky_scale(c)),
               linear_memory=True),
        Method("logn", "RoPE + log-n", "rope", lambda c: LogN(_default_frequencies(c), c.training_length)),
        Method("alibi", "ALiBi (trained)", "alibi", lambda c: Alibi(c.num_heads)),
        Method("nope", "NoPE (trained)", "nope", lambda c: NoPosition()),
        Method("pi_finetuned", "PI, fine-tuned", "pi_finetuned",
               _rotary(lambda c: {"rope_type": "linear", "factor": c.finetune_factor})),
        Method("yarn_finetuned", "YaRN, fine-tuned", "yarn_finetuned",
               _rotary(lambda c: _yarn_config(c.finetune_factor, c))),
    )
}
