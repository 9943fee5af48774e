"""Typed RoPE configuration, read from a Hugging Face style ``rope_parameters`` mapping.

Hugging Face keeps RoPE settings in a plain dict (``config.rope_parameters``, formerly
``config.rope_scaling``). :func:`parse_config` turns such a mapping into a frozen
:class:`RopeConfig`, checking every key once, so the frequency functions in
:mod:`rope.frequencies` can be pure functions of typed values.

**The keys.** The registry (:mod:`rope.registry`) says for each ``rope_type`` which keys it needs
and which it may read, in the shape of transformers' key sets (``_validate_<type>_rope_parameters``
in ``modeling_rope_utils.py``); every type also reads the :data:`rope.registry.COMMON_KEYS`. The
built-in types:

======================================  ====================================================
``rope_type`` (or legacy ``type``)      ``default``, ``linear``, ``ntk_aware``, ``ntk`` (vLLM's),
                                        ``dynamic``, ``yarn``, ``longrope``, ``llama3``, ``proportional``,
                                        ``deepseek_yarn``, ``deepseek_llama_scaling``, ``telechat3-yarn``,
                                        ``axial``, ``mllama4``, ``xdrope``; missing means ``default``
vLLM's and HunYuan's keys               ``alpha`` (``dynamic``, ``xdrope``), ``mixed_b`` (``ntk``),
                                        ``short_mscale``, ``long_mscale`` (``longrope``),
                                        ``apply_yarn_scaling`` (``yarn``), ``xdrope_section``
                                        (``xdrope``), ``extrapolation_factor``, ``attn_factor``
                                        (``telechat3-yarn``): read as those libraries mean them
``rope_theta``                          the base b of theta_i = b^(-2i/d), > 1; default 10000, except for
                                        ``llama3`` and ``proportional``, which need it (as in transformers)
``partial_rotary_factor``               fraction of the head dimension that rotates, in (0, 1]
``max_position_embeddings``             the model's context length (``dynamic``'s L; a stand-in below),
                                        in [1, 2^63]
``original_max_position_embeddings``    the pre-training context length L (yarn, longrope, llama3),
                                        in [1, 2^63]
``factor``                              the context-extension factor s >= 1
yarn                                    ``beta_fast``, ``beta_slow`` (> 0, beta_fast >= beta_slow; default 32 and 1),
                                        ``mscale``, ``mscale_all_dim``, ``attention_factor`` (> 0),
                                        ``truncate`` (a bool)
longrope                                ``short_factor``, ``long_factor`` (lists of rotary_dim/2 numbers > 0),
                                        ``attention_factor``
llama3                                  ``low_freq_factor``, ``high_freq_factor`` (high > low > 0)
M-RoPE: ``mrope_section``               pairs that follow the t, h, w positions (:mod:`rope.mrope`);
M-RoPE: ``mrope_interleaved``           interleaved assignment (Qwen3-VL) instead of chunked (Qwen2-VL);
                                        ``interleaved`` is Qwen3-Omni's name for it;
M-RoPE: ``mrope_style``                 (rope's own key) ``chunked``, ``interleaved``, ``alternating`` or
                                         ``openpangu`` (rope_type ``openpangu`` sets it)
======================================  ====================================================

A needed key may have stand-ins (:attr:`rope.registry.RopeType.stand_ins`): ``original_max_position_embeddings``
defaults to ``max_position_embeddings`` (transformers' ``standardize_rope_params`` does the same),
and yarn's and longrope's ``factor`` to max_position_embeddings / original_max_position_embeddings
when both are given (DeepSeek-V3, Phi-3); a factor so derived below 1 (max_position_embeddings <
original_max_position_embeddings) is used, as transformers uses it, with a :class:`RopeConfigWarning`
(an explicit factor must be >= 1). ``rope_theta`` has no stand-in: a legacy ``rope_scaling`` block
(Llama 3.1's) does not carry the model's base, which sits at the top level of its config.

M-RoPE combines with any ``rope_type``: the frequencies are those of the type, the section only
says which position each pair reads. ``rope_type`` ``mrope`` (old Qwen2-VL configs) means
``default`` with a required ``mrope_section``, as transformers reads it; the legacy ``type: mrope``
beside any ``rope_type`` is that marker, and the ``rope_type`` gives the frequencies (as in
transformers, where ``rope_type`` wins).

**The key policy** (nothing is silently ignored). A key whose value is ``None`` counts as absent,
as transformers stores absent keys, with one exception: yarn's ``truncate: None`` means ``False``
(no truncation), since transformers reads ``get("truncate", True)`` and gets a falsy None. For
every other key, :func:`parse_config`:

* reads a key of the type or a common key, and checks its value: ``TypeError`` for the wrong type
  (a flag that is not a bool, an integer given as ``4096.0``, a string for a number), ``ValueError``
  for the wrong value (NaN, infinity, out of range), the message naming the key; NumPy integers
  are integers and NumPy floats numbers; a needed key that is missing, with no stand-in, is a
  ``ValueError`` naming it;
* **refuses** a key of another ecosystem whose meaning is numeric (:data:`FOREIGN_KEYS`: vLLM's
  ``attn_factor`` and ``extrapolation_factor``, HunYuan's ``alpha``, ``base``, ``theta``,
  ``rotary_emb_base``, ``scaling_factor`` ...) with a ``ValueError`` that names the key and says
  what rope's key is: honouring it under rope's reading could be wrong, and ignoring it would
  silently change the numbers (a type registered to read such a key reads it); FoPE's keys
  (``use_fope``, ``num_inv_freq``, ``fope_sep_head``, ``fope_init_factor``: vLLM's
  ``FourierRotaryEmbedding``) are refused so, pointing to :func:`rope.apply_fope`, since learned
  per-head coefficients, not a frequency table, define FoPE;
* keeps the keys of a registered type that :class:`RopeConfig` has no field for in
  :attr:`RopeConfig.extra`, each through the type's key check (:mod:`rope.registry`);
* refuses ``type`` and ``rope_type`` that disagree (``type: mrope`` agrees with any ``rope_type``), and
  M-RoPE style keys that disagree;
* **warns** (:class:`RopeConfigWarning`) about a key rope knows that the given ``rope_type`` does
  not read (``low_freq_factor`` with yarn, ``short_factor`` with linear), as transformers does
  ("Unrecognized keys in `rope_parameters`"), and ignores it: published configs carry such
  leftovers, transformers loads them with a warning and computes the same numbers without them;
* warns about any other key (a typo such as ``rope_thetaa``, with the closest known key) and
  ignores it, except the keys of :data:`MODEL_KEYS`, which models read outside the rotary
  embedding (Ministral 3's ``llama_4_scaling_beta``): those are accepted without a warning, as
  transformers' ``ignore_keys_at_rope_validation`` accepts them.

A :class:`RopeConfig` made directly follows the same rule for its fields: a field the ``rope_type``
does not read (``RopeConfig(factor=8.0)`` of type ``default``) warns in the same words and is
dropped (stored as ``None``).

Two readings differ from transformers on purpose: a beta_fast or beta_slow of 0 (which
transformers replaces by its default, ``beta_fast or 32``) is refused, as is beta_fast < beta_slow
(transformers warns and ramps backwards); ``mscale`` or ``mscale_all_dim`` of 0 keeps its meaning
in transformers and DeepSeek's code: absent.

Numbers that make the frequencies or the attention factor degenerate (an overflow, a zero
divisor, a frequency that rounds to 0 in float32) are refused by :func:`rope.inv_freq`, naming
the keys; see :mod:`rope.frequencies`.
"""

from __future__ import annotations

import difflib
import os
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch

from . import _checks, registry
from .mrope import MROPE_STYLES, check_section, section_axes
from .registry import COMMON_KEYS, FIELD_KEYS

DEFAULT_THETA = 10000.0
MAX_LENGTH = 2**63
"""The largest context length (``max_position_embeddings``, ``seq_len``): positions are int64."""
YARN_BETA_FAST = 32.0
YARN_BETA_SLOW = 1.0


class RopeConfigWarning(UserWarning):
    """A config key that rope does not read for the given ``rope_type`` and ignores, or a config
    whose numbers rope computes as transformers does although they are likely a mistake (a factor
    below 1 derived from the two context lengths)."""


MODEL_KEYS = frozenset({"llama_4_scaling_beta"})
"""Keys that models keep in ``rope_parameters`` and read outside the rotary embedding (Ministral 3
and Mistral 4 scale the queries by position with ``llama_4_scaling_beta``): accepted and unused."""

FOREIGN_KEYS: dict[str, str] = {
    "base": "rope's key for the base b is 'rope_theta'",
    "theta": "rope's key for the base b is 'rope_theta'",
    "rotary_emb_base": "rope's key for the base b is 'rope_theta' (GPT-NeoX's rotary_emb_base)",
    "rotary_base": "rope's key for the base b is 'rope_theta' (Megatron-LM's rotary_base)",
    "rope_freq_base": "rope's key for the base b is 'rope_theta' (llama.cpp's rope_freq_base)",
    "rope_ratio": "ChatGLM's rope_ratio multiplies the base: give rope_theta = 10000 * rope_ratio",
    "scaling_factor": "rope's key for the extension factor s is 'factor' (vLLM's scaling_factor)",
    "rope_scaling_factor": "rope's key for the extension factor s is 'factor'",
    "rope_freq_scale": "llama.cpp's rope_freq_scale is 1/s: give rope_type 'linear' with factor = 1 / rope_freq_scale",
    "attn_factor": ("vLLM's attn_factor multiplies YaRN's mscale; rope's 'attention_factor' replaces the whole "
                    "factor: give attention_factor = attn_factor * (0.1 ln(factor) + 1) (rope_type 'telechat3-yarn' "
                    "reads attn_factor as vLLM does)"),
    "attention_scaling": "rope's key for the factor on cos and sin is 'attention_factor'",
    "extrapolation_factor": ("vLLM's YaRN extrapolation_factor weights the kept frequencies; rope (as transformers) "
                             "keeps them with weight 1 and has no key for it (rope_type 'telechat3-yarn' reads it as "
                             "vLLM does)"),
    "alpha": ("HunYuan's NTK alpha raises the base to rope_theta * alpha^(d/(d-2)); rope_type 'dynamic' reads it "
              "as HunYuan and vLLM do (or give rope_type 'ntk_aware' with factor = alpha)"),
    "mixed_b": "vLLM's mixed NTK exponent mixed_b is read by rope_type 'ntk' only",
    "short_mscale": ("PhiMoE's short_mscale and long_mscale are read by rope_type 'longrope' only; elsewhere "
                     "rope's key is 'attention_factor'"),
    "long_mscale": ("PhiMoE's short_mscale and long_mscale are read by rope_type 'longrope' only; elsewhere "
                    "rope's key is 'attention_factor'"),
    "rotary_pct": "rope's key for the rotated fraction of the head is 'partial_rotary_factor'",
    "rotary_percentage": "rope's key for the rotated fraction of the head is 'partial_rotary_factor'",
    "rotary_dim": "rope's key for the rotated width is 'partial_rotary_factor' = rotary_dim / head_dim",
    **dict.fromkeys(("use_fope", "num_inv_freq", "fope_sep_head", "fope_init_factor"), (
        "it is a key of FoPE (vLLM's FourierRotaryEmbedding), whose learned per-head coefficients cos_coef and "
        "sin_coef mix the frequencies, so no frequency table holds it: rotate with rope.apply_fope (its frequencies "
        "from rope.fope.fope_inv_freq), or drop the FoPE keys where FoPE is off")),
}
"""Keys of other ecosystems with a numeric meaning, refused with what rope's key is."""


@dataclass(frozen=True)
class RopeConfig:
    """A validated RoPE configuration. ``None`` means "not given": ``rope_theta`` then becomes
    10000 (a type that needs it, llama3 or proportional, refuses it) and ``truncate`` True. Every
    value is checked when the config is made (directly or by :func:`parse_config`): a wrong type
    raises ``TypeError``, a wrong value or a missing needed key ``ValueError``, each naming the
    key; a field the type does not read warns (:class:`RopeConfigWarning`) and is dropped, as
    :func:`parse_config` drops such a key. Read-only, hashable (``extra`` aside), and it pickles
    and deep-copies.

    Args:
        rope_type: the registered ``rope_type`` (:mod:`rope.registry`), ``"default"`` if not given.
        rope_theta: the base b of theta_i = b^(-2i/d), > 1; ``None``: 10000.
        factor: the context-extension factor s >= 1.
        max_position_embeddings: the model's context length, in [1, 2^63].
        original_max_position_embeddings: the pre-training context length L, in [1, 2^63].
        partial_rotary_factor: the fraction of the head dimension that rotates, in (0, 1].
        beta_fast: yarn: pairs turning more than beta_fast times over L keep their frequency
            (> 0, default 32).
        beta_slow: yarn: pairs turning fewer than beta_slow times over L are interpolated
            (> 0, at most beta_fast, default 1).
        mscale: yarn: m of the attention factor's numerator mscale(s, m) = 0.1 m ln s + 1
            (DeepSeek-V3); 0 means absent.
        mscale_all_dim: yarn: m of the attention factor's denominator; 0 means absent.
        truncate: yarn: whether the ramp's bounds are floored and ceiled to whole pairs; ``None``: True.
        attention_factor: yarn and longrope: the factor on cos and sin, replacing the computed one (> 0).
        short_factor: longrope: the rotary_dim/2 per-pair factors within L (each > 0).
        long_factor: longrope: the rotary_dim/2 per-pair factors beyond L (each > 0).
        low_freq_factor: llama3: L / low_freq_factor is the wavelength above which pairs are
            interpolated (> 0).
        high_freq_factor: llama3: L / high_freq_factor is the wavelength below which pairs keep
            their frequency (> low_freq_factor).
        mrope_section: M-RoPE: the pairs that follow the t, h, w positions (:mod:`rope.mrope`).
        mrope_style: M-RoPE: ``"chunked"`` (Qwen2-VL), ``"interleaved"`` (Qwen3-VL), ``"alternating"``
            (ERNIE 4.5 VL) or ``"openpangu"`` (vLLM's rope_type ``openpangu``).
        extra: the keys of a registered type that have no field here, each through its key check.
    """

    rope_type: str = "default"
    rope_theta: float | None = None
    factor: float | None = None
    max_position_embeddings: int | None = None
    original_max_position_embeddings: int | None = None
    partial_rotary_factor: float = 1.0
    # yarn
    beta_fast: float | None = None
    beta_slow: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool | None = None
    # yarn and longrope
    attention_factor: float | None = None
    # longrope
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None
    # llama3
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    # M-RoPE
    mrope_section: tuple[int, int, int] | None = None
    mrope_style: str = "chunked"
    # keys of a registered type that have no field here (rope.registry), checked by its key_checks
    extra: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self):
        if not isinstance(self.rope_type, str):
            raise TypeError(f"config key 'rope_type' must be a str, got {type(self.rope_type).__name__} "
                            f"{self.rope_type!r}")
        entry = registry.rope_type(self.rope_type)
        for key in sorted(FIELD_KEYS - COMMON_KEYS - entry.keys):
            if getattr(self, key) is not None:
                _warn_ignored(key, entry.name)
                object.__setattr__(self, key, None)
        for key, check in _FIELD_CHECKS.items():
            value = getattr(self, key)
            if value is not None:
                object.__setattr__(self, key, check(f"config key {key!r}", value))
        object.__setattr__(self, "extra", MappingProxyType(_checked_extra(entry, self.extra)))
        self._check_required(entry)
        for key, default in _DEFAULTS.items():
            if getattr(self, key) is None:
                object.__setattr__(self, key, default)
        self._check_pairs()
        self._warn_derived_factor(entry)

    def __getstate__(self) -> dict[str, Any]:
        # a MappingProxyType does not pickle: extra travels as a dict, and comes back read-only
        return {**self.__dict__, "extra": dict(self.extra)}

    def __setstate__(self, state: Mapping[str, Any]) -> None:
        for key, value in state.items():
            object.__setattr__(self, key, MappingProxyType(dict(value)) if key == "extra" else value)

    def given(self, key: str) -> bool:
        """Whether ``key`` has a value: a field that is not None, or a key of :attr:`extra`.

        Args:
            key: a config key.
        """
        return self.extra.get(key) is not None if key not in FIELD_KEYS else getattr(self, key) is not None

    def _check_required(self, entry: registry.RopeType) -> None:
        for key in entry.required:
            stand_in = entry.stand_ins.get(key, ())
            if not self.given(key) and not (stand_in and all(self.given(k) for k in stand_in)):
                alternative = f" (or {' and '.join(map(repr, stand_in))})" if stand_in else ""
                raise ValueError(f"rope_type {self.rope_type!r} needs the config key {key!r}{alternative}"
                                 f"{_MISSING_HINTS.get(key, '')}")

    def _warn_derived_factor(self, entry: registry.RopeType) -> None:
        """Warn when ``factor`` is absent and its stand-in, the ratio of the two lengths, is < 1."""
        lengths = ("max_position_embeddings", "original_max_position_embeddings")
        if self.factor is None and tuple(entry.stand_ins.get("factor", ())) == lengths:
            longer, original = self.max_position_embeddings, self.original_max_position_embeddings
            if longer is not None and original is not None and longer < original:
                warnings.warn(
                    f"rope_type {self.rope_type!r} has no 'factor', so it uses max_position_embeddings / "
                    f"original_max_position_embeddings = {longer} / {original} = {longer / original} < 1, as "
                    "transformers does: the context shrinks instead of being extended (an explicit factor must be "
                    ">= 1); give 'factor' or the lengths the model was trained and extended to",
                    RopeConfigWarning, stacklevel=_outside_rope())

    def _check_pairs(self) -> None:
        """Keys that bound each other: beta_fast >= beta_slow, high_freq_factor > low_freq_factor."""
        fast = YARN_BETA_FAST if self.beta_fast is None else self.beta_fast
        slow = YARN_BETA_SLOW if self.beta_slow is None else self.beta_slow
        if fast < slow:
            raise ValueError(
                f"config keys 'beta_fast' ({fast}) and 'beta_slow' ({slow}) must satisfy beta_fast >= beta_slow "
                "(pairs turning more than beta_fast times over L keep their frequency, those turning fewer "
                "than beta_slow times are interpolated; defaults 32 and 1)")
        low, high = self.low_freq_factor, self.high_freq_factor
        if low is not None and high is not None and not high > low:
            raise ValueError(f"config keys 'high_freq_factor' ({high}) and 'low_freq_factor' ({low}) must satisfy "
                             "high_freq_factor > low_freq_factor")

    def rotary_dim(self, head_dim: int) -> int:
        """The rotated width d = int(head_dim * partial_rotary_factor), as transformers computes it;
        the whole head for ``proportional``, whose unrotated pairs get the frequency 0 instead.

        Args:
            head_dim: the model's head dimension, a positive integer.

        Raises:
            ValueError: where the rotated width is odd or below 2 (for ``proportional``, an odd head_dim).
        """
        head_dim = _checks.integer("head_dim", head_dim, minimum=1)
        if self.rope_type == "proportional":
            if head_dim % 2:
                raise ValueError(
                    f"rope_type 'proportional' rotates the whole head: head_dim must be even, got {head_dim}"
                )
            return head_dim
        dim = int(head_dim * self.partial_rotary_factor)
        if dim < 2 or dim % 2:
            raise ValueError(
                f"the rotary dimension int(head_dim * partial_rotary_factor) = "
                f"int({head_dim} * {self.partial_rotary_factor}) = {dim} must be even and >= 2"
            )
        return dim

    def mrope_axes(self, head_dim: int) -> torch.Tensor | None:
        """The t/h/w axis of each rotated pair (:func:`rope.mrope.section_axes`), or ``None``
        without an ``mrope_section``.

        Args:
            head_dim: the model's head dimension (the pairs are :meth:`rotary_dim` / 2).
        """
        if self.mrope_section is None:
            return None
        return section_axes(self.mrope_section, self.rotary_dim(head_dim) // 2, style=self.mrope_style)

    def original_length(self) -> int:
        """L, the pre-training context: ``original_max_position_embeddings``, else
        ``max_position_embeddings`` (transformers' ``standardize_rope_params`` does the same)."""
        if self.original_max_position_embeddings is not None:
            return self.original_max_position_embeddings
        if self.max_position_embeddings is not None:
            return self.max_position_embeddings
        raise ValueError(
            f"rope_type {self.rope_type!r} needs the config key 'original_max_position_embeddings' "
            "(or 'max_position_embeddings')"
        )

    def extension_factor(self) -> float:
        """s: ``factor``, else max_position_embeddings / original_max_position_embeddings."""
        if self.factor is not None:
            return self.factor
        if self.max_position_embeddings is not None and self.original_max_position_embeddings is not None:
            return self.max_position_embeddings / self.original_max_position_embeddings
        raise ValueError(
            f"rope_type {self.rope_type!r} needs the config key 'factor' (or both "
            "'max_position_embeddings' and 'original_max_position_embeddings')"
        )


def _base(name: str, value) -> float:
    base = _checks.number(name, value)
    if not base > 1:
        raise ValueError(f"{name} must be > 1 (theta_i = b^(-2i/d) falls with i), got {base}")
    return base


def _length(name: str, value) -> int:
    return _checks.integer(name, value, minimum=1, maximum=MAX_LENGTH)


def _fraction(name: str, value) -> float:
    fraction = _checks.number(name, value)
    if not 0 < fraction <= 1:
        raise ValueError(f"{name} must be in (0, 1], got {fraction}")
    return fraction


def _factor_list(name: str, value) -> tuple[float, ...]:
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{name} must be a list of numbers, got {type(value).__name__} {value!r}")
    return tuple(_checks.number(f"{name}[{i}]", v, positive=True) for i, v in enumerate(value))


def _positive(name: str, value) -> float:
    return _checks.number(name, value, positive=True)


def _style(name: str, value) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__} {value!r}")
    return _checks.choice(name, value, MROPE_STYLES)


_FIELD_CHECKS = {
    "rope_theta": _base,
    "factor": lambda name, value: _checks.number(name, value, minimum=1.0),
    "max_position_embeddings": _length,
    "original_max_position_embeddings": _length,
    "partial_rotary_factor": _fraction,
    "beta_fast": _positive,
    "beta_slow": _positive,
    "mscale": _checks.number,
    "mscale_all_dim": _checks.number,
    "truncate": _checks.flag,
    "attention_factor": _positive,
    "short_factor": _factor_list,
    "long_factor": _factor_list,
    "low_freq_factor": _positive,
    "high_freq_factor": _positive,
    "mrope_section": lambda name, value: check_section(value, name),
    "mrope_style": _style,
}
"""Per field, its check: the value as stored, or TypeError/ValueError naming the key."""

_DEFAULTS = {"rope_theta": DEFAULT_THETA, "truncate": True}
"""The fields whose ``None`` ("not given") becomes a value once the required keys are checked."""

_MISSING_HINTS = {
    "rope_theta": (": a legacy rope_scaling block does not carry the model's base, which sits at the top level of "
                   "its config (Llama 3.1's rope_theta is 500000)"),
}
"""What a missing needed key's message adds."""

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _outside_rope() -> int:
    """The ``stacklevel`` at which a warning raised by the caller names the first frame outside
    rope (and outside :class:`RopeConfig`'s generated ``__init__``): the user's line."""
    level, frame = 1, sys._getframe(1)  # level 1: the function that warns
    while frame is not None and (frame.f_code.co_filename.startswith(_PACKAGE_DIR)
                                 or frame.f_code is RopeConfig.__init__.__code__):
        level, frame = level + 1, frame.f_back
    return level


def _checked_extra(entry: registry.RopeType, extra: Mapping[str, Any]) -> dict[str, Any]:
    """The ``extra`` keys of a config of type ``entry``, each through its key check."""
    if not isinstance(extra, Mapping):
        raise TypeError(f"extra must be a mapping of config keys, got {type(extra).__name__}")
    checked = {}
    for key, value in extra.items():
        if key in FOREIGN_KEYS and key not in entry.keys:
            raise ValueError(f"extra config key {key!r} is not rope's: {FOREIGN_KEYS[key]}")
        if key in FIELD_KEYS or key not in entry.keys:
            where = "a field of RopeConfig" if key in FIELD_KEYS else f"not read by rope_type {entry.name!r}"
            raise ValueError(f"extra config key {key!r} is {where}")
        if value is not None:
            check = entry.key_checks.get(key)
            checked[key] = check(f"config key {key!r}", value) if check else value
    return checked


def parse_config(config: Mapping[str, Any] | RopeConfig) -> RopeConfig:
    """Validate a ``rope_parameters`` mapping and return a :class:`RopeConfig`, following the key
    policy of the module docstring (refusals raise, ignored keys warn with :class:`RopeConfigWarning`).

    Args:
        config: a ``rope_parameters`` mapping (one layer type's, with string keys), or a
            :class:`RopeConfig`, returned as it is.

    Raises:
        TypeError, ValueError: for a key of the wrong type or value, a missing needed key, a
            foreign key (:data:`FOREIGN_KEYS`) or keys that disagree, naming the key.
    """
    if isinstance(config, RopeConfig):
        return config
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a mapping such as rope_parameters, got {type(config).__name__}")
    given = _given(config)
    entry = registry.rope_type(_rope_type(given))
    values: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in given.items():
        if key in _FIELD_CHECKS:  # a field: RopeConfig checks it, or warns and drops it if the type does not read it
            values[key] = value
        elif key in COMMON_KEYS:
            pass
        elif key in entry.keys:
            extra[key] = value
        elif key in FOREIGN_KEYS:
            raise ValueError(f"config key {key!r} is not rope's: {FOREIGN_KEYS[key]}")
        elif key not in MODEL_KEYS:
            _warn_ignored(key, entry.name)
    if "truncate" in config and config["truncate"] is None and "truncate" in entry.keys:
        values["truncate"] = False  # transformers' get("truncate", True) is None: no truncation
    style = _mrope_style(given)
    if entry.name == "openpangu":
        style = _openpangu_style(given, style)
    if style is not None:
        values["mrope_style"] = style
    return RopeConfig(rope_type=entry.name, extra=extra, **values)


def _given(config: Mapping) -> dict[str, Any]:
    """The keys of ``config`` whose value is not None, after the checks that need the whole
    mapping: string keys, no nesting by layer type."""
    nested = sorted(str(key) for key, value in config.items() if isinstance(value, Mapping))
    if nested:
        raise ValueError(
            f"config is nested by layer type (keys {', '.join(map(repr, nested))}), as in Gemma 3: pass the "
            "mapping of one layer type, or give the model config to rope.hf.RotaryEmbedding, which keeps one per type"
        )
    given = {}
    for key, value in config.items():
        if not isinstance(key, str):
            raise TypeError(f"config keys must be str, got {type(key).__name__} {key!r}")
        if value is not None:
            given[key] = value
    return given


def _rope_type(given: Mapping[str, Any]) -> str:
    """The ``rope_type`` (legacy ``type``; ``mrope`` is ``default`` with a needed section, as
    transformers reads Qwen2-VL's configs, which say ``type: mrope`` and ``rope_type: default``).
    ``type: mrope`` beside another ``rope_type`` (a Qwen2.5-VL config extended with yarn) marks
    M-RoPE and the ``rope_type`` gives the frequencies, as in transformers, where ``rope_type``
    wins; any other ``type`` must agree with ``rope_type``."""
    said = {}
    for key in ("rope_type", "type"):
        if key in given:
            if not isinstance(given[key], str):
                raise TypeError(f"config key {key!r} must be a str, got {type(given[key]).__name__} {given[key]!r}")
            said[key] = given[key]
    if "mrope" in said.values() and "mrope_section" not in given:
        raise ValueError("rope_type 'mrope' needs the config key 'mrope_section'")
    if "rope_type" in said and said.get("type") == "mrope":
        del said["type"]  # the M-RoPE marker: rope_type wins
    types = {"default" if value == "mrope" else value for value in said.values()}
    if len(types) > 1:
        raise ValueError(f"config keys 'rope_type' ({said['rope_type']!r}) and 'type' ({said['type']!r}) disagree")
    return types.pop() if types else "default"


def _mrope_style(given: Mapping[str, Any]) -> str | None:
    """The M-RoPE style the keys ``mrope_style``, ``mrope_interleaved`` and ``interleaved`` say,
    or None if none is given; they must agree."""
    said = {}
    for key in ("mrope_interleaved", "interleaved"):
        if key in given:
            said[key] = "interleaved" if _checks.flag(f"config key {key!r}", given[key]) else "chunked"
    if "mrope_style" in given:
        said["mrope_style"] = _style("config key 'mrope_style'", given["mrope_style"])
    if len(set(said.values())) > 1:
        raise ValueError("config keys " + " and ".join(f"{k!r} ({given[k]!r})" for k in said) + " disagree")
    return next(iter(said.values()), None)


def _openpangu_style(given: Mapping[str, Any], style: str | None) -> str:
    """vLLM's rope_type ``openpangu`` (``MRotaryEmbeddingInterleaved``) needs an ``mrope_section``
    and ``mrope_interleaved`` true; its pairs follow :func:`rope.mrope.openpangu_axes`."""
    if "mrope_section" not in given:
        raise ValueError("rope_type 'openpangu' needs config key 'mrope_section' (pairs on t, h, w), as vLLM does")
    if style not in ("interleaved", "openpangu"):
        raise ValueError("rope_type 'openpangu' needs config key 'mrope_interleaved' true, as vLLM does, got "
                         f"{given.get('mrope_interleaved', given.get('mrope_style'))!r}")
    return "openpangu"


def _warn_ignored(key: str, rope_type: str) -> None:
    readers = [entry.name for entry in registry.registered() if key in entry.keys]
    if readers:
        reason = f"rope_type {rope_type!r} does not read it (only {', '.join(map(repr, readers))} do)"
    else:
        known = COMMON_KEYS.union(*(entry.keys for entry in registry.registered()))
        close = difflib.get_close_matches(key, sorted(known), n=1)
        reason = "rope does not know it" + (f"; did you mean {close[0]!r}?" if close else "")
    warnings.warn(f"config key {key!r} is ignored: {reason}", RopeConfigWarning, stacklevel=_outside_rope())
