"""The ``rope_type`` registry: one entry per type, its frequency function and its config keys.

An entry (:class:`RopeType`) says what a type computes and what it reads, in the shape of
transformers' ``ROPE_INIT_FUNCTIONS`` plus its per-type key validation
(``_validate_<type>_rope_parameters`` in ``modeling_rope_utils.py``), kept in one place so that a
type cannot exist for the frequencies and not for the config parser, or the other way round:

* ``frequencies(config, rotary_dim, seq_len) -> (inv_freq, attention_factor)``, a pure function of
  a validated :class:`rope.RopeConfig`, the rotary width d and the current length (or ``None``);
  :func:`rope.inv_freq` checks what it returns (a tuple of d/2 finite float32 frequencies > 0 and
  a finite attention factor > 0; frequencies of 0, pairs that do not rotate, only for a type
  registered with ``zero_frequencies=True``, as ``proportional`` is), so a registered function
  cannot hand a silently wrong table onwards: anything else is a ``TypeError`` or ``ValueError``
  naming the type;
* ``required`` and ``optional`` keys besides the common ones (:data:`COMMON_KEYS`):
  :func:`rope.parse_config` refuses a config that lacks a required key (unless all its
  ``stand_ins``, keys the type reads or common keys, are given) and warns about keys the type does
  not read; a common key (``rope_theta``) may be required, as ``llama3`` and ``proportional`` do;
* ``key_checks`` for keys that :class:`rope.RopeConfig` has no field for: each maps the key's
  name and value to the value stored in ``RopeConfig.extra`` (or raises ``TypeError`` /
  ``ValueError`` naming the key); a key without a check is stored as given.

:mod:`rope.frequencies` registers the built-in types; :func:`register_rope_type` adds others::

    # HunYuan's NTK alpha: b' = b * alpha^(d/(d-2))
    def alpha_ntk(cfg, dim, seq_len):
        base = cfg.rope_theta * cfg.extra["alpha"] ** (dim / (dim - 2))
        return (base ** -(torch.arange(0, dim, 2, dtype=torch.float64) / dim)).float(), 1.0

    # the key's check: a number >= 1, stored as a float
    def alpha(name, value):
        if not (isinstance(value, (int, float)) and value >= 1):
            raise ValueError(f"{name} must be a number >= 1, got {value!r}")
        return float(value)

    rope.register_rope_type("alpha_ntk", alpha_ntk, required_keys=("alpha",),
                            key_checks={"alpha": alpha})
    rope.inv_freq({"rope_type": "alpha_ntk", "alpha": 1000.0}, 128)
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from . import _checks

Frequencies = tuple[torch.Tensor, float]
FrequencyFunction = Callable[[Any, int, "int | None"], Frequencies]

RESERVED_NAMES = frozenset({"mrope"})
"""Names a type may not take: ``mrope`` means ``default`` with an ``mrope_section`` (old Qwen2-VL
configs), as transformers reads it."""

COMMON_KEYS = frozenset({
    "rope_type", "type", "rope_theta", "partial_rotary_factor", "max_position_embeddings",
    "original_max_position_embeddings", "mrope_section", "mrope_interleaved", "interleaved", "mrope_style",
})
"""Keys every ``rope_type`` accepts. The two context lengths are among them because model configs
carry them at the top level whatever the type (:func:`rope.hf.rope_parameters_from_config` folds
them in); types that do not read them ignore them without a warning."""

FIELD_KEYS = frozenset({
    "rope_type", "rope_theta", "factor", "max_position_embeddings", "original_max_position_embeddings",
    "partial_rotary_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate", "attention_factor",
    "short_factor", "long_factor", "low_freq_factor", "high_freq_factor", "mrope_section", "mrope_style",
})
"""The keys :class:`rope.RopeConfig` stores as typed fields (its fields but ``extra``), which it checks
itself: a registered type's ``key_checks`` may not name them, and its other keys go to
``RopeConfig.extra``. Here, not in :mod:`rope.config`, because the registry checks registrations
against them and :mod:`rope.config` reads the registry (tests/test_registry.py checks that the two
agree)."""



@dataclass(frozen=True)
class RopeType:
    """One registered ``rope_type``: its frequency function and the config keys it reads besides
    the common ones. ``stand_ins`` maps a required key to keys that, all given, can take its place
    (yarn's ``factor`` from the two context lengths). ``zero_frequencies``: the type may give
    pairs the frequency 0 (they do not rotate), as ``proportional`` does; otherwise every
    frequency must be > 0.

    Args:
        name: the ``rope_type`` name.
        frequencies: ``frequencies(config, rotary_dim, seq_len) -> (inv_freq, attention_factor)``.
        required: the keys the type needs besides the common ones.
        optional: the keys the type may read besides the common ones.
        stand_ins: per required key, the keys that, all given, can take its place.
        key_checks: per key without a :class:`rope.RopeConfig` field, its check ``(name, value) -> value``.
        zero_frequencies: the type may give pairs the frequency 0.
    """

    name: str
    frequencies: FrequencyFunction
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    stand_ins: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    key_checks: Mapping[str, Callable[[str, Any], Any]] = field(default_factory=dict)
    zero_frequencies: bool = False

    @property
    def keys(self) -> frozenset[str]:
        """Every key the type reads besides the common ones."""
        return frozenset(self.required + self.optional)


_REGISTRY: dict[str, RopeType] = {}


def _key_names(name: str, keys) -> tuple[str, ...]:
    if isinstance(keys, str) or not isinstance(keys, (tuple, list, frozenset, set)):
        raise TypeError(f"{name} must be a tuple of str, got {type(keys).__name__} {keys!r}")
    for key in keys:
        if not isinstance(key, str) or not key:
            raise TypeError(f"{name} must hold non-empty str keys, got {key!r}")
    return tuple(keys)


def register_rope_type(
    name: str,
    frequencies: FrequencyFunction,
    *,
    required_keys=(),
    optional_keys=(),
    stand_ins: Mapping[str, tuple[str, ...]] | None = None,
    key_checks: Mapping[str, Callable[[str, Any], Any]] | None = None,
    zero_frequencies: bool = False,
    replace: bool = False,
) -> RopeType:
    """Register ``frequencies`` as the ``rope_type`` ``name`` and return its :class:`RopeType`.

    ``required_keys`` and ``optional_keys`` are the config keys the type reads besides
    :data:`COMMON_KEYS` (a common key may be required); ``stand_ins`` maps a required
    key to keys, read by the type or common, that can replace it; ``key_checks`` validates keys
    that :class:`rope.RopeConfig` has no field for (their values land in ``RopeConfig.extra``);
    ``zero_frequencies=True`` lets ``frequencies`` give 0 to pairs that do not rotate (otherwise
    :func:`rope.inv_freq` refuses a frequency <= 0). A name already registered raises
    ``ValueError`` unless ``replace=True``.

    Args:
        name: the new ``rope_type``, a non-empty str other than ``mrope``.
        frequencies: ``frequencies(config, rotary_dim, seq_len) -> (inv_freq, attention_factor)``, a
            pure function of a validated :class:`rope.RopeConfig`, the rotary width d and the current
            length (or ``None``).
        required_keys: the config keys the type needs besides :data:`COMMON_KEYS` (a common key may
            be one).
        optional_keys: the config keys the type may read besides :data:`COMMON_KEYS`.
        stand_ins: maps a required key to keys, read by the type or common, that all given replace it.
        key_checks: maps a key that :class:`rope.RopeConfig` has no field for to its check
            ``(name, value) -> value``, which returns the value to store or raises naming the key.
        zero_frequencies: let ``frequencies`` give 0 to pairs that do not rotate.
        replace: replace a type already registered under ``name``.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {type(name).__name__} {name!r}")
    if name in RESERVED_NAMES:
        raise ValueError(f"name {name!r} is reserved: it means 'default' with an 'mrope_section'")
    if not callable(frequencies):
        raise TypeError(f"frequencies must be callable (config, rotary_dim, seq_len), got {type(frequencies).__name__}")
    replace = _checks.flag("replace", replace)
    zero_frequencies = _checks.flag("zero_frequencies", zero_frequencies)
    if name in _REGISTRY and not replace:
        raise ValueError(f"rope_type {name!r} is already registered; pass replace=True to replace it")
    required = _key_names("required_keys", required_keys)
    optional = _key_names("optional_keys", optional_keys)
    if set(required) & set(optional):
        raise ValueError(f"required_keys and optional_keys share {sorted(set(required) & set(optional))}")
    stand_ins = dict(stand_ins or {})
    for key, keys in stand_ins.items():
        if key not in required:
            raise ValueError(f"stand_ins names {key!r}, which is not among required_keys {required}")
        stand_ins[key] = _key_names(f"stand_ins[{key!r}]", keys)
        unread = [k for k in stand_ins[key] if (k not in required + optional and k not in COMMON_KEYS) or k == key]
        if unread or not stand_ins[key]:
            raise ValueError(f"stand_ins[{key!r}] must name keys other than {key!r} that rope_type {name!r} reads "
                             f"(required_keys, optional_keys or a common key), got {stand_ins[key]}")
    key_checks = dict(key_checks or {})

    for key, check in key_checks.items():
        if key in FIELD_KEYS:
            raise ValueError(f"key_checks names {key!r}, which RopeConfig checks itself (a field of RopeConfig)")
        if key not in required + optional:
            raise ValueError(f"key_checks names {key!r}, which is not among required_keys or optional_keys")
        if not callable(check):
            raise TypeError(f"key_checks[{key!r}] must be callable (name, value), got {type(check).__name__}")
    entry = RopeType(name, frequencies, required, optional, types.MappingProxyType(stand_ins),
                     types.MappingProxyType(key_checks), zero_frequencies)
    _REGISTRY[name] = entry
    return entry


def unregister_rope_type(name: str) -> RopeType:
    """Remove a registered type and return its entry (``ValueError`` if it is not registered).

    Args:
        name: the registered ``rope_type``.
    """
    entry = rope_type(name)
    del _REGISTRY[name]
    return entry


def rope_type(name: str) -> RopeType:
    """The registered entry of ``name``, or a ``ValueError`` listing the registered types.

    Args:
        name: a ``rope_type`` name.
    """
    if not isinstance(name, str):
        raise TypeError(f"rope_type must be a str, got {type(name).__name__} {name!r}")
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown rope_type {name!r}; expected one of {', '.join(_REGISTRY)} (or 'mrope'), "
                         "or one added with rope.register_rope_type") from None


def rope_types() -> tuple[str, ...]:
    """The registered ``rope_type`` names, in registration order."""
    return tuple(_REGISTRY)


def registered() -> tuple[RopeType, ...]:
    """Every registered entry, in registration order."""
    return tuple(_REGISTRY.values())
