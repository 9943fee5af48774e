"""The rope_type registry: one place for a type's frequencies and its config keys.

A type registered with :func:`rope.register_rope_type` is read by :func:`rope.parse_config` (its
required keys enforced, its own keys checked and kept in ``RopeConfig.extra``, other keys warned
about) and computed by :func:`rope.inv_freq`, which checks what the function returns. References
are the formulas written here in float64, rounded once to float32.
"""

import dataclasses
import math
import warnings

import pytest
import torch

import rope
from rope.config import FOREIGN_KEYS
from rope.registry import rope_type, unregister_rope_type

BUILT_IN = ("default", "linear", "ntk_aware", "ntk", "dynamic", "yarn", "longrope", "llama3", "proportional",
            "deepseek_yarn", "deepseek_llama_scaling", "telechat3-yarn", "openpangu", "axial", "mllama4", "xdrope")


def alpha_theta(base: float, alpha: float, dim: int) -> torch.Tensor:
    """HunYuan's NTK alpha, written from its formula: b' = b alpha^(d/(d-2)), theta_i = b'^(-2i/d)."""
    new_base = base * alpha ** (dim / (dim - 2))
    return torch.tensor([new_base ** (-2 * i / dim) for i in range(dim // 2)], dtype=torch.float64)


def at_least_one(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if not value >= 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return float(value)


def alpha_frequencies(cfg, dim, seq_len):
    temperature = cfg.extra.get("temperature", 1.0)
    return alpha_theta(cfg.rope_theta, cfg.extra["alpha"], dim).to(torch.float32), temperature


@pytest.fixture
def alpha_type():
    """The type 'alpha_ntk' registered for one test, removed after it."""
    entry = rope.register_rope_type("alpha_ntk", alpha_frequencies, required_keys=("alpha",),
                                    optional_keys=("temperature", "factor"), key_checks={"alpha": at_least_one})
    yield entry
    unregister_rope_type("alpha_ntk")


@pytest.fixture
def registered():
    """Register any function under fresh names for one test; every name is removed after it."""
    names = []

    def register(frequencies, **keys):
        name = f"test_type_{len(names)}"
        rope.register_rope_type(name, frequencies, **keys)
        names.append(name)
        return name

    yield register
    for name in names:
        unregister_rope_type(name)


def test_built_in_types_are_registered_in_order():
    assert rope.rope_types() == BUILT_IN
    assert rope_type("yarn").keys >= {"factor", "beta_fast", "truncate"}


@pytest.mark.parametrize("alpha", [1.0, 1000.0, 2.5])
@pytest.mark.parametrize("head_dim", [4, 64, 128])
def test_a_registered_type_gives_its_formula(alpha_type, alpha, head_dim):
    base = 5e5 * torch.rand(()).item() + 2
    theta, attention = rope.inv_freq({"rope_type": "alpha_ntk", "rope_theta": base, "alpha": alpha}, head_dim)
    assert theta.dtype == torch.float32 and attention == 1.0
    assert torch.equal(theta, alpha_theta(base, alpha, head_dim).to(torch.float32))
    assert "alpha_ntk" in rope.rope_types()


def test_its_keys_are_checked_and_kept_in_extra(alpha_type):
    cfg = rope.parse_config({"rope_type": "alpha_ntk", "alpha": 4, "temperature": 1.5, "factor": 2})
    assert cfg.extra == {"alpha": 4.0, "temperature": 1.5} and cfg.factor == 2.0
    assert type(cfg.extra["alpha"]) is float  # through its key check
    with pytest.raises(TypeError):
        cfg.extra["alpha"] = 3.0  # read-only
    with pytest.raises(ValueError, match="'alpha'"):
        rope.parse_config({"rope_type": "alpha_ntk"})
    with pytest.raises(ValueError, match="'alpha' must be >= 1"):
        rope.parse_config({"rope_type": "alpha_ntk", "alpha": 0.5})
    with pytest.raises(TypeError, match="'alpha' must be a number"):
        rope.parse_config({"rope_type": "alpha_ntk", "alpha": "2"})
    with pytest.raises(ValueError, match="'factor'"):  # a field key keeps RopeConfig's own check
        rope.parse_config({"rope_type": "alpha_ntk", "alpha": 2, "factor": 0.5})


def test_its_key_is_not_foreign_but_stays_foreign_for_others(alpha_type, registered):
    name = registered(alpha_frequencies, required_keys=("alpha",))  # 'alpha' is HunYuan's foreign key
    assert "alpha" in FOREIGN_KEYS
    assert rope.parse_config({"rope_type": name, "alpha": 3.0}).extra == {"alpha": 3.0}  # no check: as given
    with pytest.raises(ValueError, match="'alpha' is not rope's"):
        rope.parse_config({"rope_type": "default", "alpha": 3.0})


def test_keys_it_does_not_read_warn(alpha_type):
    with pytest.warns(rope.RopeConfigWarning, match="'low_freq_factor'.*only 'llama3'"):
        rope.parse_config({"rope_type": "alpha_ntk", "alpha": 2.0, "low_freq_factor": 1.0})
    with pytest.warns(rope.RopeConfigWarning, match="'temperature'.*only 'alpha_ntk'"):
        rope.parse_config({"rope_type": "linear", "factor": 2.0, "temperature": 2.0})


def test_direct_config_extra_is_checked(alpha_type):
    cfg = rope.RopeConfig(rope_type="alpha_ntk", extra={"alpha": 8})
    assert cfg.extra["alpha"] == 8.0
    with pytest.raises(ValueError, match="'factor' is a field of RopeConfig"):
        rope.RopeConfig(rope_type="alpha_ntk", extra={"alpha": 8, "factor": 2.0})
    with pytest.raises(ValueError, match="'beta' is not read by rope_type 'alpha_ntk'"):
        rope.RopeConfig(rope_type="alpha_ntk", extra={"alpha": 8, "beta": 2.0})
    with pytest.raises(ValueError, match="'alpha'"):
        rope.RopeConfig(rope_type="alpha_ntk")
    with pytest.raises(TypeError, match="extra must be a mapping"):
        rope.RopeConfig(rope_type="alpha_ntk", extra=[("alpha", 8)])
    assert hash(cfg) == hash(rope.RopeConfig(rope_type="alpha_ntk", extra={"alpha": 9}))  # extra is not hashed
    assert cfg != rope.RopeConfig(rope_type="alpha_ntk", extra={"alpha": 9})


def test_stand_ins_may_name_keys_the_type_reads(registered):
    name = registered(alpha_frequencies, required_keys=("alpha", "factor"), optional_keys=("temperature",),
                      stand_ins={"factor": ("temperature",)})
    assert rope.parse_config({"rope_type": name, "alpha": 2.0, "temperature": 3.0}).factor is None


def test_stand_ins_replace_a_required_key(registered):
    name = registered(alpha_frequencies, required_keys=("alpha", "factor"),
                      stand_ins={"factor": ("max_position_embeddings", "original_max_position_embeddings")})
    with pytest.raises(ValueError, match="'factor' \\(or 'max_position_embeddings' and"):
        rope.parse_config({"rope_type": name, "alpha": 2.0})
    cfg = rope.parse_config({"rope_type": name, "alpha": 2.0, "max_position_embeddings": 64,
                             "original_max_position_embeddings": 16})
    assert cfg.extension_factor() == 4.0


@pytest.mark.parametrize("result, error, match", [
    (lambda d: (torch.ones(d // 2 + 1), 1.0), ValueError, "frequencies"),
    (lambda d: (torch.ones(d // 2, dtype=torch.float64), 1.0), TypeError, "float32"),
    (lambda d: (torch.full((d // 2,), math.nan), 1.0), ValueError, "inv_freq"),
    (lambda d: (torch.full((d // 2,), math.inf), 1.0), ValueError, "inv_freq"),
    (lambda d: (-torch.ones(d // 2), 1.0), ValueError, "<= 0"),
    (lambda d: (torch.ones(d // 2), 0.0), ValueError, "attention factor"),
    (lambda d: (torch.ones(d // 2), math.nan), ValueError, "attention factor"),
    (lambda d: (torch.ones(d // 2), True), TypeError, "a number"),
    (lambda d: (torch.ones(d // 2).tolist(), 1.0), TypeError, "float32 tensor"),
    (lambda d: None, TypeError, "must return a pair .*got NoneType"),
    (lambda d: torch.ones(2), TypeError, "must return a pair .*got Tensor"),  # would unpack into 2 numbers
    (lambda d: (torch.ones(d // 2), 1.0, 0), TypeError, "must return a pair .*got a 3-tuple"),
    (lambda d: [torch.ones(d // 2), 1.0], TypeError, "must return a pair .*got list"),
    (lambda d: (torch.ones(d // 2, device="meta"), 1.0), ValueError, "meta tensor"),
    (lambda d: (torch.zeros(d // 2), 1.0), ValueError, "frequencies <= 0; expected 8 frequencies > 0"),
    (lambda d: (torch.cat([torch.ones(d // 2 - 1), torch.zeros(1)]), 1.0), ValueError, "zero_frequencies=True"),
])
def test_what_a_registered_function_returns_is_checked(registered, result, error, match):
    name = registered(lambda cfg, dim, seq_len: result(dim))
    with pytest.raises(error, match=match) as raised:
        rope.inv_freq({"rope_type": name}, 16)
    assert f"rope_type '{name}'" in str(raised.value)


def test_zero_frequencies_only_for_a_type_registered_with_them(registered):
    """Pairs that do not rotate (theta_i = 0) are what proportional RoPE means: the one built-in
    type registered with zero_frequencies=True. Another such type may give zeros, never < 0."""
    assert [entry for entry in BUILT_IN if rope_type(entry).zero_frequencies] == ["proportional"]
    still = int(torch.randint(1, 8, ()).item())
    theta = torch.rand(8) + 0.1
    theta[-still:] = 0
    name = registered(lambda cfg, dim, seq_len: (theta.clone(), 1.0), zero_frequencies=True)
    got, _ = rope.inv_freq({"rope_type": name}, 16)
    assert got.equal(theta)
    negative = registered(lambda cfg, dim, seq_len: (-theta, 1.0), zero_frequencies=True)
    with pytest.raises(ValueError, match=f"rope_type '{negative}' gave frequencies < 0"):
        rope.inv_freq({"rope_type": negative}, 16)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(name="default"), ValueError, "already registered"),
    (dict(name="mrope"), ValueError, "reserved"),
    (dict(name=""), TypeError, "name"),
    (dict(name=3), TypeError, "name"),
    (dict(frequencies="not callable"), TypeError, "frequencies must be callable"),
    (dict(required_keys="alpha"), TypeError, "required_keys must be a tuple"),
    (dict(optional_keys=("ok", 3)), TypeError, "optional_keys"),
    (dict(required_keys=("a",), optional_keys=("a",)), ValueError, "share"),
    (dict(stand_ins={"factor": ("x",)}), ValueError, "stand_ins names 'factor'"),
    (dict(required_keys=("factor",), stand_ins={"factor": ("factr",)}), ValueError,
     "stand_ins\\['factor'\\] must name keys other than 'factor' that rope_type 'fresh_type' reads"),
    (dict(required_keys=("factor",), stand_ins={"factor": ("factor",)}), ValueError, "other than 'factor'"),
    (dict(required_keys=("factor",), stand_ins={"factor": ()}), ValueError, "stand_ins\\['factor'\\] must name"),
    (dict(zero_frequencies=1), TypeError, "zero_frequencies must be a bool"),
    (dict(required_keys=("a",), key_checks={"b": at_least_one}), ValueError, "key_checks names 'b'"),
    (dict(required_keys=("factor",), key_checks={"factor": at_least_one}), ValueError, "a field of RopeConfig"),
    (dict(required_keys=("a",), key_checks={"a": 3}), TypeError, "key_checks\\['a'\\] must be callable"),
    (dict(name="default", replace=1), TypeError, "replace"),
    (dict(name="default", replace="yes"), TypeError, "replace"),
])
def test_bad_registrations_are_refused_and_change_nothing(kwargs, error, match):
    before = rope.rope_types(), rope_type("default")
    arguments = dict(name="fresh_type", frequencies=alpha_frequencies) | kwargs
    name, frequencies = arguments.pop("name"), arguments.pop("frequencies")
    with pytest.raises(error, match=match):
        rope.register_rope_type(name, frequencies, **arguments)
    assert (rope.rope_types(), rope_type("default")) == before


def test_replace_and_unregister():
    original = rope_type("linear")
    try:
        rope.register_rope_type("linear", alpha_frequencies, required_keys=("alpha",), replace=True)
        theta, _ = rope.inv_freq({"rope_type": "linear", "alpha": 2.0}, 8)
        assert torch.equal(theta, alpha_theta(1e4, 2.0, 8).to(torch.float32))
    finally:
        rope.register_rope_type("linear", original.frequencies, required_keys=original.required, replace=True)
    assert rope.rope_types() == BUILT_IN
    entry = rope.register_rope_type("short_lived", alpha_frequencies, required_keys=("alpha",))
    assert unregister_rope_type("short_lived") is entry
    for call in (lambda: rope.inv_freq({"rope_type": "short_lived", "alpha": 2.0}, 8),
                 lambda: unregister_rope_type("short_lived")):
        with pytest.raises(ValueError, match="unknown rope_type 'short_lived'.*register_rope_type"):
            call()


def test_unknown_types_name_the_registry():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="unknown rope_type 'yarn2'; expected one of default, linear"):
            rope.parse_config({"rope_type": "yarn2"})
    with pytest.raises(TypeError, match="rope_type must be a str"):
        rope_type(None)


def test_the_registry_docstring_example_runs():
    """The example in rope.registry's docstring registers HunYuan's alpha, equal to rope's ntk_aware type
    with factor = alpha (what rope.config's refusal of the foreign key 'alpha' tells users)."""
    import textwrap

    import rope.registry

    doc = rope.registry.__doc__
    example = textwrap.dedent(doc[doc.index("::") + 2:])
    try:
        exec(example, {"rope": rope, "torch": torch})
        theta, _ = rope.inv_freq({"rope_type": "alpha_ntk", "alpha": 1000.0}, 128)
        ntk, _ = rope.inv_freq({"rope_type": "ntk_aware", "factor": 1000.0}, 128)
        assert torch.allclose(theta, ntk, rtol=1e-6, atol=0)
    finally:
        unregister_rope_type("alpha_ntk")


def test_field_keys_are_the_fields_of_rope_config():
    """The registry lists RopeConfig's typed keys itself (rope.config imports the registry, not the
    other way round): the list must be the dataclass's fields, ``extra`` aside."""
    assert rope.registry.FIELD_KEYS == {f.name for f in dataclasses.fields(rope.RopeConfig)} - {"extra"}
