"""A small causal transformer whose attention logits come from a pluggable position scheme.

Pre-norm blocks (LayerNorm, causal self-attention, LayerNorm, GELU MLP), token embeddings and
no absolute position embedding: every piece of position information enters through the
attention logits

    a_mn = scheme.logits(q, k, positions)[m, n],      softmax over keys n <= m,

where the scheme rotates q and k (RoPE and its context-extension variants), adds a bias (ALiBi)
or does nothing (NoPE: only the causal mask tells positions apart; Haviv et al. 2022). The
attention is written out (``scheme.attend``: the whole seq x seq matrix) so that every scheme
plugs into the same place; ReRoPE's scheme replaces it with RoPE inside attention, which never
forms that matrix.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import nn

from .._checks import integer, tensor
from .methods import PositionScheme


@dataclass(frozen=True)
class ModelSpec:
    """Sizes of :class:`TinyTransformer`.

    Args:
        vocab_size: the number of token ids.
        d_model: the width of the residual stream, num_heads times an even head dimension.
        num_heads: the attention heads per layer.
        num_layers: the number of blocks.
        mlp_ratio: the MLP's hidden width over d_model.
    """

    vocab_size: int
    d_model: int = 64
    num_heads: int = 4
    num_layers: int = 2
    mlp_ratio: int = 4

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "num_heads", "num_layers", "mlp_ratio"):
            object.__setattr__(self, name, integer(name, getattr(self, name), minimum=1))
        if self.d_model % self.num_heads or (self.d_model // self.num_heads) % 2:
            raise ValueError(
                f"d_model / num_heads must be an even integer (the rotary head dimension), "
                f"got d_model={self.d_model}, num_heads={self.num_heads}"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    def to_dict(self) -> dict:
        return asdict(self)


class CausalSelfAttention(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.qkv = nn.Linear(spec.d_model, 3 * spec.d_model, bias=False)
        self.out = nn.Linear(spec.d_model, spec.d_model, bias=False)

    def forward(self, x: torch.Tensor, scheme: PositionScheme, positions: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q, k, v = self.qkv(x).view(batch, seq, 3, self.spec.num_heads, self.spec.head_dim).unbind(2)
        return self.out(scheme.attend(q, k, v, positions).reshape(batch, seq, -1))


class Block(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.norm_attention = nn.LayerNorm(spec.d_model)
        self.attention = CausalSelfAttention(spec)
        self.norm_mlp = nn.LayerNorm(spec.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(spec.d_model, spec.mlp_ratio * spec.d_model),
            nn.GELU(),
            nn.Linear(spec.mlp_ratio * spec.d_model, spec.d_model),
        )

    def forward(self, x, scheme, positions):
        x = x + self.attention(self.norm_attention(x), scheme, positions)
        return x + self.mlp(self.norm_mlp(x))


class TinyTransformer(nn.Module):
    """Next-token logits ``[batch, seq, vocab]`` of int64 tokens ``[batch, seq]`` (positions 0 .. seq-1).

    Args:
        spec: the model's sizes.
    """

    def __init__(self, spec: ModelSpec):
        super().__init__()
        if not isinstance(spec, ModelSpec):
            raise TypeError(f"spec must be a ModelSpec, got {type(spec).__name__}")
        self.spec = spec
        self.embed = nn.Embedding(spec.vocab_size, spec.d_model)
        self.blocks = nn.ModuleList(Block(spec) for _ in range(spec.num_layers))
        self.norm = nn.LayerNorm(spec.d_model)
        self.unembed = nn.Linear(spec.d_model, spec.vocab_size, bias=False)
        nn.init.normal_(self.embed.weight, std=1 / math.sqrt(spec.d_model))

    def forward(self, tokens: torch.Tensor, scheme: PositionScheme) -> torch.Tensor:
        tensor("tokens", tokens)
        if tokens.dtype != torch.int64:
            raise TypeError(f"tokens must be an int64 tensor [batch, seq], got {tokens.dtype}")
        if tokens.dim() != 2:
            raise ValueError(f"tokens must have shape [batch, seq], got {tuple(tokens.shape)}")
        if not isinstance(scheme, PositionScheme):
            raise TypeError(f"scheme must be a PositionScheme, got {type(scheme).__name__}")
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, scheme, positions)
        return self.unembed(self.norm(x))
