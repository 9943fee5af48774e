"""rope.hf.axes: rotary modules that read positions on several axes (HunYuan-VL's XD-RoPE blocks,
NeoMME's alternating row and column).

* the tables are transformers' formula (HunYuanVLRotaryEmbedding.recomposition_frequencies and
  NeoMMERotaryEmbedding.recomposition_frequencies, written here in float64 on mpmath's cos and sin
  of the exact angles of rope's float32 frequencies, within a unit of transformers' own, and the
  attention factor of transformers' module),
  every entry rounded once to the dtype of x, at positions up to 2^20 drawn on their own for
  each axis; and transformers' module's own tables near 0 to float32 noise;
* a pair whose two columns read different axes (HunYuan-VL's blocks) is reproduced as the model
  computes it;
* install swaps these modules for rope's, which the models then read (HunYuan-VL's model reads
  ``rotary_emb.mrope_section``), and refuses a module of another layout naming each layout's gap;
* hostile inputs (another number of axes, float or bool position ids, non-float x, x and
  positions on different devices, bad constructor arguments) are refused by name."""

import pytest
import torch

import rope
from helpers import FLOAT_DTYPES, assert_correctly_rounded, exact_cos_sin, names
from rope.hf import axes
from rope.hf.embedding import rope_parameters_from_config

transformers = pytest.importorskip("transformers")
from transformers.models.hunyuan_vl import configuration_hunyuan_vl, modeling_hunyuan_vl  # noqa: E402
from transformers.models.neomme import configuration_neomme, modeling_neomme  # noqa: E402

from rope.hf import coverage  # noqa: E402

FAR = 2**20


def hunyuan_config(sections, **rope_parameters):
    """A HunYuan-VL text config of head_dim 2 sum(sections) with these sections (and rope parameters)."""
    params = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": list(sections), **rope_parameters}
    head_dim = 2 * sum(sections)
    return configuration_hunyuan_vl.HunYuanVLTextConfig(hidden_size=4 * head_dim, num_attention_heads=4,
                                                        head_dim=head_dim, max_position_embeddings=64,
                                                        rope_parameters=params)


def neomme_config():
    return configuration_neomme.NeoMMEConfig(hidden_size=64, num_attention_heads=2, num_key_value_heads=2,
                                             head_dim=32, num_hidden_layers=2,
                                             layer_types=["sliding_attention", "full_attention"])


def hunyuan_reference(positions, theta, attention, sections):
    """HunYuanVLRotaryEmbedding.forward in float64 on exact angles: cos and sin of m_a theta_i
    ``[A, batch, seq, p]``, each doubled (``cat(t, t)``), split into blocks of 2 s_b columns,
    block b from axis b mod len(sections), times the attention factor."""
    cos, sin = exact_cos_sin(positions, theta)

    def recomposed(t):
        t = torch.cat((t, t), dim=-1)
        blocks = t.split([2 * s for s in sections], dim=-1)
        return torch.cat([m[i % len(sections)] for i, m in enumerate(blocks)], dim=-1) * attention

    return recomposed(cos), recomposed(sin)


def neomme_reference(positions, theta, attention):
    """NeoMMERotaryEmbedding.forward in float64 on exact angles: even pairs from row 0, odd pairs
    from row 1 (interleaved back), the result doubled, times the attention factor."""
    cos, sin = exact_cos_sin(positions, theta)

    def recomposed(t):
        angles = torch.stack([t[0][..., 0::2], t[1][..., 1::2]], dim=-1).flatten(-2)
        return torch.cat([angles, angles], dim=-1) * attention

    return recomposed(cos), recomposed(sin)


def far_positions(gen, rows, batch=2, seq=6):
    """Positions in [0, 2^20] drawn on their own for every axis, 2^20 itself on each."""
    positions = torch.randint(0, FAR + 1, (rows, batch, seq), generator=gen)
    positions[:, 0, -1] = FAR
    positions[:, 1, 0] = torch.arange(rows)  # rows differ near 0 too
    return positions


@pytest.mark.parametrize("sections", [(2, 2, 2, 2), (1, 3, 0, 4), (4, 1, 2, 1), (3, 2, 3)])
@pytest.mark.parametrize("rope_parameters", [{}, {"rope_type": "yarn", "factor": 4.0,
                                                  "original_max_position_embeddings": 16},
                                             {"rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0}])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_blocks_are_hunyuan_vls_tables_rounded_once(sections, rope_parameters, dtype):
    config = hunyuan_config(sections, **rope_parameters)
    theirs = modeling_hunyuan_vl.HunYuanVLRotaryEmbedding(config)
    ours = axes.AxesRotaryEmbedding(rope_parameters=rope_parameters_from_config(config), head_dim=config.head_dim,
                                    axes=len(sections), layout="blocks", sections=list(sections))
    # rope's frequencies are the exact ones rounded once to float32, transformers' float32 power a unit off or so
    torch.testing.assert_close(ours.inv_freq, theirs.inv_freq, rtol=2**-22, atol=0)
    assert ours.attention_scaling == pytest.approx(theirs.attention_scaling, rel=1e-12)
    gen = torch.Generator().manual_seed(len(sections) + 7 * len(rope_parameters))
    positions = far_positions(gen, len(sections))
    cos, sin = ours(torch.zeros(1, dtype=dtype), positions)
    ref_cos, ref_sin = hunyuan_reference(positions, ours.inv_freq, theirs.attention_scaling, sections)
    assert cos.dtype == sin.dtype == dtype and cos.shape == (2, 6, config.head_dim)
    assert_correctly_rounded(cos, ref_cos)
    assert_correctly_rounded(sin, ref_sin)
    near = positions % 16  # transformers' float32 angles are exact enough near 0
    torch.testing.assert_close(ours(torch.zeros(1), near), theirs(torch.zeros(1), near), rtol=0, atol=1e-5)


def test_a_pairs_two_columns_read_different_axes():
    """HunYuan-VL's sections (2, 2, 2, 2) on p = 8 pairs: pair 0's first column reads axis 0 and
    its second column axis 2, so moving axis 2 alone changes only the second halves of pairs 0-3."""
    ours = axes.AxesRotaryEmbedding(rope_parameters={"rope_theta": 1e4}, head_dim=16, axes=4, layout="blocks",
                                    sections=[2, 2, 2, 2])
    assert ours.column_axes.tolist() == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4
    positions = torch.tensor([[[5]], [[6]], [[7]], [[8]]])
    moved = positions.clone()
    moved[2] += 1000
    changed = (ours(torch.zeros(1), positions)[0] != ours(torch.zeros(1), moved)[0])[0, 0]
    assert changed.nonzero().flatten().tolist() == [8, 9, 10, 11]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_alternating_is_neommes_tables_rounded_once(dtype):
    config = neomme_config()
    theirs = modeling_neomme.NeoMMERotaryEmbedding(config)
    gen = torch.Generator().manual_seed(11)
    positions = far_positions(gen, 2)
    for layer_type, params in config.rope_parameters.items():
        ours = axes.AxesRotaryEmbedding(rope_parameters=params, head_dim=config.head_dim, axes=2,
                                        layout="alternating")
        theta = getattr(theirs, f"{layer_type}_inv_freq")
        attention = getattr(theirs, f"{layer_type}_attention_scaling")
        torch.testing.assert_close(ours.inv_freq, theta, rtol=2**-22, atol=0)
        cos, sin = ours(torch.zeros(1, dtype=dtype), positions)
        ref_cos, ref_sin = neomme_reference(positions, ours.inv_freq, attention)
        assert cos.shape == ref_cos.shape == (2, 6, 2 * theta.numel())
        assert_correctly_rounded(cos, ref_cos)
        assert_correctly_rounded(sin, ref_sin)
        near = positions % 16
        torch.testing.assert_close(ours(torch.zeros(1), near), theirs(torch.zeros(1), near, layer_type), rtol=0,
                                   atol=1e-5)


def test_one_row_means_the_same_position_on_every_axis():
    ours = axes.AxesRotaryEmbedding(rope_parameters={"rope_theta": 1e4}, head_dim=16, axes=4, layout="blocks",
                                    sections=[1, 3, 0, 4])
    positions = torch.randint(0, FAR, (2, 5), generator=torch.Generator().manual_seed(3))
    expanded = ours(torch.zeros(1), positions.expand(4, -1, -1))
    for given in (positions, positions[None]):
        assert all(torch.equal(a, b) for a, b in zip(ours(torch.zeros(1), given), expanded))
    plain = rope.hf.RotaryEmbedding(rope_parameters={"rope_theta": 1e4}, head_dim=16)(torch.zeros(1), positions)
    assert all(torch.equal(a, b) for a, b in zip(plain, expanded))


def test_dynamic_reads_the_length_over_every_axis():
    """transformers' dynamic NTK reads max(position_ids) + 1 over all rows: a long last axis
    changes every column's frequency, as in transformers' module (a fresh one per call)."""
    config = hunyuan_config((2, 2, 2, 2), rope_type="dynamic", factor=2.0)
    ours = axes.AxesRotaryEmbedding(rope_parameters=rope_parameters_from_config(config), head_dim=16, axes=4,
                                    layout="blocks", sections=[2, 2, 2, 2])
    positions = torch.arange(8).expand(4, 1, -1).clone()
    positions[3, 0, -1] = 200  # past max_position_embeddings = 64 on the last axis only
    theirs = modeling_hunyuan_vl.HunYuanVLRotaryEmbedding(config)(torch.zeros(1), positions)
    got = ours(torch.zeros(1), positions)
    assert not torch.equal(ours.frequencies(positions)[0], ours.inv_freq)
    for a, b in zip(got, theirs):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4)  # float32 angles at 200


@pytest.mark.parametrize("model_type, sections", [("hunyuan_vl_text", [2, 2, 2, 2]), ("hunyuan_vl_text", [3, 2, 3]),
                                                  ("hunyuan_vl", [2, 2, 2, 2]), ("neomme", None)])
def test_install_swaps_the_module_and_the_model_reads_it(model_type, sections):
    """Installed, the model's output is transformers' near 0; HunYuan-VL with three sections
    reads M-RoPE's three rows, in its blocks, which no M-RoPE style lays out so."""
    config = coverage.tiny_config(model_type)
    if sections is not None:
        config.get_text_config().rope_parameters["mrope_section"] = sections
    model = coverage.tiny_model(model_type, config=config)
    tokens = coverage.sample_tokens(seed=5)
    expected = coverage.output(model, tokens)
    assert rope.hf.install(model) == 1
    (module,) = [m for name, m in model.named_modules() if name.endswith("rotary_emb")]
    inner = list(module.layer_types.values()) if model_type == "neomme" else [module]
    assert all(isinstance(m, axes.AxesRotaryEmbedding) for m in inner)
    assert {m.layout for m in inner} == {"alternating" if model_type == "neomme" else "blocks"}
    assert all(m.mrope_section == sections and m.axes == (2 if sections is None else len(sections)) for m in inner)
    torch.testing.assert_close(coverage.output(model, tokens), expected, **coverage.LOGITS_TOLERANCE)
    assert rope.hf.install(model) == 0  # rope's module is left as it is


class _SwappedAxes(modeling_hunyuan_vl.HunYuanVLRotaryEmbedding):
    """HunYuan-VL's module reading its axes in reverse order: no layout of rope.hf.axes."""

    def recomposition_frequencies(self, freq):
        return super().recomposition_frequencies(freq.flip(0))


def test_install_refuses_another_layout_naming_each_gap():
    model = coverage.tiny_model("hunyuan_vl_text")
    old = model.rotary_emb
    model.rotary_emb = _SwappedAxes(model.config)
    swapped = model.rotary_emb
    with pytest.raises(ValueError, match=r"reads positions on 4 axes .*blocks of mrope_section \[2, 2, 2, 2\]: off by "
                                         r".*alternating: off by .*nothing was replaced"):
        rope.hf.install(model)
    assert model.rotary_emb is swapped and old is not swapped


BASE = {"rope_theta": 1e4}


@pytest.mark.parametrize("kwargs, error, name", [
    (dict(axes=4, layout="blocks", sections=[2, 2, 2, 1]), ValueError, "sections"),
    (dict(axes=4, layout="blocks", sections=[4, 4]), TypeError, "sections"),
    (dict(axes=4, layout="blocks", sections=None), TypeError, "sections"),
    (dict(axes=4, layout="blocks", sections=[2, 2, 6, -2]), ValueError, "sections[3]"),
    (dict(axes=4, layout="blocks", sections=[2, 2, 2, 2.0]), TypeError, "sections[3]"),
    (dict(axes=2, layout="alternating", sections=[4, 4]), ValueError, "sections"),
    (dict(axes=2, layout="chunked"), ValueError, "layout"),
    (dict(axes=0, layout="alternating"), ValueError, "axes"),
    (dict(axes=True, layout="alternating"), TypeError, "axes"),
])
def test_bad_constructor_arguments_are_refused_by_name(kwargs, error, name):
    with pytest.raises(error) as info:
        axes.AxesRotaryEmbedding(rope_parameters=BASE, head_dim=16, **kwargs)
    assert names(str(info.value), name), str(info.value)


def test_rope_parameters_must_be_a_mapping():
    with pytest.raises(TypeError, match="rope_parameters must be a mapping"):
        axes.AxesRotaryEmbedding(rope_parameters=[("rope_theta", 1e4)], head_dim=16, axes=2, layout="alternating")


@pytest.mark.parametrize("x, position_ids, error, name", [
    (torch.zeros(1), torch.zeros(3, 1, 4, dtype=torch.long), ValueError, "position_ids"),  # M-RoPE's three rows
    (torch.zeros(1), torch.zeros(5, 1, 4, dtype=torch.long), ValueError, "position_ids"),
    (torch.zeros(1), torch.zeros(4, dtype=torch.long), ValueError, "position_ids"),
    (torch.zeros(1), torch.zeros(4, 1, 1, 4, dtype=torch.long), ValueError, "position_ids"),
    (torch.zeros(1), torch.zeros(4, 1, 4), TypeError, "position_ids"),  # float positions
    (torch.zeros(1), torch.full((4, 1, 4), 0.5, dtype=torch.float64), TypeError, "position_ids"),
    (torch.zeros(1), torch.zeros(4, 1, 4, dtype=torch.bool), TypeError, "position_ids"),
    (torch.zeros(1), [[0, 1, 2]], TypeError, "position_ids"),
    (torch.zeros(1, dtype=torch.long), torch.zeros(4, 1, 4, dtype=torch.long), TypeError, "x"),
    (None, torch.zeros(4, 1, 4, dtype=torch.long), TypeError, "x"),
    (torch.zeros(1, device="meta"), torch.zeros(4, 1, 4, dtype=torch.long), ValueError, "position_ids"),  # devices
])
def test_bad_inputs_are_refused_by_name(x, position_ids, error, name):
    module = axes.AxesRotaryEmbedding(rope_parameters=BASE, head_dim=16, axes=4, layout="blocks",
                                      sections=[2, 2, 2, 2])
    with pytest.raises(error) as info:
        module(x, position_ids)
    assert names(str(info.value), name), str(info.value)


def test_casts_keep_the_float32_frequencies():
    module = axes.AxesRotaryEmbedding(rope_parameters=BASE, head_dim=16, axes=2, layout="alternating")
    theta = module.inv_freq.clone()
    module.to(torch.bfloat16)
    assert module.inv_freq.dtype == torch.float32 and torch.equal(module.inv_freq, theta)
    assert module.column_axes.dtype == torch.int64


class _GivenTables(torch.nn.Module):
    """A rotary module that returns the tables it was given (and HunYuan-VL's sections, which its model reads)."""

    def __init__(self, tables, mrope_section):
        super().__init__()
        self.tables, self.mrope_section = tables, mrope_section

    def forward(self, x, position_ids):
        return tuple(t.to(x.dtype) for t in self.tables)


@pytest.mark.parametrize("offset", [0, 2**16])
def test_patched_hunyuan_vl_reads_four_different_rows_exactly(offset):
    """A tiny HunYuan-VL text model fed four different rows of positions (as an image's P, W, H,
    T), moved by ``offset``: patched, its output is the model's with the exact tables of its
    formula (:func:`hunyuan_reference`, rounded once to float32, handed to its own function),
    where transformers' own float32 angles at 2^16 are off. (Its formula is not relative where a
    pair's columns read different rows, so there is no shift invariance to check.)"""
    model = coverage.tiny_model("hunyuan_vl_text")
    tokens = coverage.sample_tokens(seed=9)
    gen = torch.Generator().manual_seed(9)
    rows = torch.stack([torch.randperm(20, generator=gen) for _ in range(4)])[:, None].expand(4, 2, 20) + offset

    def run():
        with torch.no_grad():
            return model(tokens, position_ids=rows).last_hidden_state

    stock, sections = model.rotary_emb, model.rotary_emb.mrope_section
    theta = axes.AxesRotaryEmbedding(rope_parameters=rope_parameters_from_config(model.config), head_dim=16, axes=4,
                                     layout="blocks", sections=sections).inv_freq
    reference = tuple(t.float() for t in hunyuan_reference(rows, theta, 1.0, sections))
    theirs = run()
    model.rotary_emb = _GivenTables(reference, sections)
    expected = run()
    model.rotary_emb = stock
    assert torch.allclose(theirs, expected, **coverage.LOGITS_TOLERANCE) == (offset == 0)
    rope.hf.patch(model)
    try:
        torch.testing.assert_close(run(), expected, **coverage.LOGITS_TOLERANCE)
    finally:
        rope.hf.unpatch(model)
    assert torch.equal(run(), theirs)
