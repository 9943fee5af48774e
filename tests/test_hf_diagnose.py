"""rope.hf.diagnose on tiny random models (no download) of every rotary model type of the
installed transformers whose tiny model builds (rope.hf.coverage_table's COVERED and REFUSED
types), one model per type shared by the tests:

* stock, every place that makes rotary tables is read in some form of rope.hf.tables (the places
  listed in NOT_ROTARY_PLACES, which are not rotary tables, are named unread), and each form's
  float32 error shows as the model's arithmetic allows: transformers' float32 angles are off by
  thousands of units at 2^20, a precomputed float32 table of n positions by at most n + 1
  units (by about half a unit where it was computed in float64: RoFormer), an image grid's
  bounded angles by a few units;
* types without rotary tables (NO_ROTARY, each with the reason read in its modeling file) are
  refused by a ValueError that says so;
* patched (rope.hf.patch), the tables of covered types are exact: within half a unit at every
  position read, for every rotary module a text forward calls;
* a planted bug is found in each form: a model cast to bfloat16 (its inv_freq rounded to
  bfloat16, transformers issue #29496) reports the first position where its error exceeds half a
  unit within the band that the formula cos(m bf16(theta_i)), computed here, allows for the
  model's float32 arithmetic; a module whose tables are built in bfloat16, a 2-D vision module, a
  sequence module and an image grid whose frequencies are rounded to bfloat16, and precomputed
  sin | cos and complex tables rounded to bfloat16 are found at their first position (their
  error there computed here); a coordinate encoder cast to bfloat16 at the first position its
  bfloat16 arithmetic allows;
* the model is left as it was, and bad arguments are refused by name.
"""

import math

import pytest
import torch
from torch import nn

import rope
from rope.hf import precision, tables

transformers = pytest.importorskip("transformers")
from rope.hf import coverage, coverage_table  # noqa: E402

COVERED = sorted(coverage_table.COVERED)
TYPES = sorted(set(COVERED) | set(coverage_table.REFUSED))
"""Every rotary model type (a modeling file that mentions rotary: rope.hf.coverage.rotary_model_types,
tabulated); those whose tiny model does not build here (too large, a library not installed: timm,
scipy) are skipped, with the reason."""

NO_ROTARY = {
    "clvp_decoder": "CLVP's decoder holds no rotary module: its attention's rotary path gets rotary_pos_emb=None "
                    "(only CLVP's encoders rotate)",
    "cosmos3_edge_vision": "the vision tower's forwards compute no cos or sin (rotary is the text model's)",
    "gemma3n_audio": "a relative position embedding (inv_timescales) added to the attention logits, not rotary",
    "gemma4_audio": "a relative positional encoding (Gemma4AudioRelPositionalEncoding), not rotary",
    "glm5_next_text": "NoPE: its decoder layers get position_embeddings=None (rotary only in the vision tower)",
    "glm_image_vision": "learned position embeddings (rotary only in the text model)",
    "glm_image_vqmodel": "a VQ-VAE: no attention rotates",
    "granite_docling_vision": "SigLIP's learned position embeddings (rotary only in the text model)",
    "hunyuan_vl_vision": "learned position embeddings (rotary only in the text model)",
    "inkling2_text": "its text model rotates nothing (rotary only in its vision tower)",
    "jamba": "JambaAttention applies no positions; the module's apply_rotary_pos_emb is unused",
    "mllama_vision_model": "learned (gated, precomputed) position embeddings (rotary only in the text model)",
    "molmo2_adapter": "an adapter without positions",
    "molmo2_vision": "learned position embeddings (rotary only in the text model)",
    "moonshine_streaming_encoder": "its encoder's attention takes no position embeddings (the decoder rotates)",
    "nemotron_asr_streaming_encoder": "a Transformer-XL relative positional encoding (relative_k_proj) with an "
                                      "inv_freq buffer, not rotary",
    "nemotron_h": "its attention applies no positions; the module's apply_rotary_pos_emb is unused",
    "parakeet_ctc": "a Transformer-XL relative positional encoding (relative_k_proj) with an inv_freq buffer, "
                    "not rotary",
    "parakeet_encoder": "a Transformer-XL relative positional encoding (relative_k_proj) with an inv_freq buffer, "
                        "not rotary",
    "parakeet_rnnt": "its encoder's Transformer-XL relative positional encoding (relative_k_proj) with an inv_freq "
                     "buffer, not rotary",
    "parakeet_tdt": "its encoder's Transformer-XL relative positional encoding (relative_k_proj) with an inv_freq "
                    "buffer, not rotary",
    "nemotron_asr_streaming": "its encoder's Transformer-XL relative positional encoding (relative_k_proj) with an "
                              "inv_freq buffer, not rotary",
    "vjepa2": "its attention computes its angles inline (rotate_queries_or_keys: omega = 10000^(-2i/D) at each "
              "call, times 3-D patch positions), with no rotary module or table, a form diagnose does not read: "
              "refused by name",
    "phi4_multimodal_vision": "SigLIP's learned position embeddings (rotary only in the text model)",
    "qwen2_5_omni_audio_encoder": "Whisper's sinusoid added to the input (SinusoidsPositionEmbedding), not rotary",
    "qwen3_omni_moe_audio_encoder": "Whisper's sinusoid added to the input (SinusoidsPositionEmbedding), not rotary",
    "sam3_detr_decoder": "DETR's sine position embeddings added to features (rotary only in SAM 3's ViT)",
    "sam3_detr_encoder": "DETR's sine position embeddings added to features (rotary only in SAM 3's ViT)",
    "sam3_mask_decoder": "DETR's sine position embeddings added to features (rotary only in SAM 3's ViT)",
    "unlimited_ocr_vision_encoder": "CLIP's learned position embeddings (rotary only in the text model)",
    "unlimited_ocr_vision": "SAM's decomposed relative position biases and CLIP's learned position embeddings "
                            "(rotary only in the text model)",
    "unlimited_ocr_sam_vision_model": "SAM's decomposed relative position biases (rel_pos_h, rel_pos_w), not rotary",
    "deepseek_ocr2_sam_vision_model": "SAM's decomposed relative position biases (rel_pos_h, rel_pos_w), not rotary",
    "chameleon_vqgan": "a VQ-VAE image tokenizer: no attention rotates",
    "emu3_vqgan": "a VQ-VAE image tokenizer: no attention rotates",
    "moshi_depth": "its decoder layers are built with use_rope=False (rotary only in Moshi's main decoder)",
    "muse_spark_audio": "a convolutional waveform encoder without attention",
    "phi4_multimodal_audio": "a relative attention bias (Phi4MultimodalAudioRelativeAttentionBias), not rotary",
    "qwen2_5_omni_bigvgan": "BigVGAN, a convolutional vocoder without attention",
    "efficientloftr": "its 2-D rotary module (EfficientLoFTRRotaryEmbedding) is called with a feature map, "
                      "forward(x) with x [batch, channels, h, w], a form diagnose does not read: refused by name "
                      "(rope's replacement, which patch swaps in, also takes 2-D position ids, and is read so)",
}
"""Types whose tiny model has no rotary tables (read in their modeling files), or none in a form
diagnose reads (named): diagnose refuses them saying so."""

NOT_ROTARY_PLACES = {
    "SinusoidsPositionEmbedding": "Whisper's absolute sinusoid added to the audio input: its [sin | cos] rows "
                                  "(theta_i = 10000^(-i/(K-1))) are not the RoPE formula's",
    "VoxtralRealtimeTimeEmbedding": "a sinusoid of the time conditioning, not rotary",
    "MusicFlamingoRotaryEmbedding": "rotary time embedding: angles of each window's timestamps times its own "
                                    "position angles, called with (timestamps, seq_len): no form diagnose reads",
    "SeamlessM4TSinusoidalPositionalEmbedding": "fairseq's absolute sinusoid added to the text and unit "
                                                "embeddings: its [sin | cos] rows (theta_i = 10000^(-i/(d/2 - 1))) "
                                                "are not the RoPE formula's",
    "EsmFold2RotaryEmbedding": "rotary over 3-D atom coordinates and a space id, called as (ref_pos, "
                               "ref_space_uid, dtype), with no inv_freq buffer: no form diagnose reads",
}
"""Places found (an inv_freq buffer, a [sin | cos] table) that no form reads, by class: named unread."""

OPTIONS = {
    "esm": {"position_embedding_type": "rotary"},
    "wav2vec2-bert": {"position_embeddings_type": "rotary"},
    "wav2vec2-conformer": {"position_embeddings_type": "rotary"},
    "seamless_m4t": {"position_embeddings_type": "rotary"},
}
"""Config settings that turn a type's rotary on (its default is absolute or relative positions)."""

FLOAT32_AT_2_20 = 1000
"""transformers' float32 angle m theta at m near 2^20 and theta near 1 is off by up to 2^-5 rad:
tens of thousands of float32 units (2^-24), where theta is not a power of two (theta = 1 is
exact); a table whose largest such theta is small sees fewer (:func:`check_stock`)."""

GRID_UNITS = 16
"""An image grid's angle 2 pi c theta (``|c|`` < 1, theta <= 1) is formed in float32 with three
roundings of at most 2^-24 ``|angle|`` <= 2^-24 2 pi each, then its cos and sin (about one unit):
within 3 * 2 pi + 1 < 20 units of 2^-24; and so within 16 at the unit 2^-24 of ``|e|`` >= 1/2."""

_MODELS: dict = {}


def tiny(model_type: str, rotary: bool = True) -> nn.Module:
    """One tiny model per type for the whole module (built once, shared by the tests); with its
    rotary option on (:data:`OPTIONS`) unless ``rotary`` is False, which sets the option to its
    config class's default (coverage's FIXES turn ESM's on). Skips a type whose tiny model
    does not build."""
    key = (model_type, rotary)
    if key not in _MODELS:
        try:
            config = coverage.tiny_config(model_type)
            for name, value in OPTIONS.get(model_type, {}).items():
                setattr(config, name, value if rotary else getattr(type(config)(), name))
            text = config.get_text_config()
            if model_type in ("hunyuan_vl", "hunyuan_vl_text"):  # its default config has no mrope_section
                text.rope_parameters["mrope_section"] = [2, 2, 2, 2]
            _MODELS[key] = coverage.tiny_model(model_type, config=config)
        except Exception as err:  # any failure to build: the type is skipped, with the reason
            _MODELS[key] = f"its tiny model does not build ({type(err).__name__}: {err})"
    if isinstance(_MODELS[key], str):
        pytest.skip(_MODELS[key][:200])
    return _MODELS[key]


def inv_freq_modules(model: nn.Module) -> set[str]:
    """The modules with a buffer named ``inv_freq`` or ``<layer type>_inv_freq``, outermost only."""
    found: set[str] = set()
    for name, module in model.named_modules():
        if any(name.startswith(f"{outer}.") for outer in found):
            continue
        if any(buffer.endswith("inv_freq") for buffer, _ in module.named_buffers(recurse=False)):
            found.add(name)
    return found


def text_path(model: nn.Module) -> set[str]:
    """The rotary modules a forward on token ids alone calls (hooks: rope.hf.coverage)."""
    calls = coverage.stock_rotary_calls(model)
    try:
        coverage.output(model, coverage.sample_tokens())
    finally:
        called = calls.close()
    return {name for name, _ in called}


def check_stock(row, source: tables.Source) -> None:
    """A stock float32 row shows its form's float32 error (module docstring)."""
    assert row.note == "" or row.form.startswith(("a precomputed", "called with an image")), row
    assert row.first_position is not None or "float64" in row.reference, row
    worst = max(v for v in (row.worst_within, row.worst_beyond) if v is not None)
    if row.form.startswith("a precomputed"):
        rows = getattr(source.module, source.tensor).shape[0]
        side = math.isqrt(rows)  # a grid's diagonal: positions o..side - 1 + o, o = 0 or 1
        assert row.limit in ((rows - 1,) if "grid" not in row.form else (side - 1, side)), row
        if "float64" in row.reference:  # RoFormer: float64 angles, rounded once to float32
            assert worst <= 0.5 + 2**-20 and row.first_position is None, row
        else:  # float32 m theta: off by 2^-24 m theta <= m units (theta <= 1), then cos or sin: one more
            assert 0.5 < worst <= row.limit + 1, row
    elif row.form.startswith("called with an image"):
        assert 0.5 < worst <= GRID_UNITS, row
    else:
        assert row.reference in ("its class rebuilt from its config",
                                 "its Linear's weights (learned), summed over the axes"), row
        assert row.limit == max(2**20, 4 * (row.length or 0)), row
        assert row.first_position <= row.worst_position, row
        name = "inv_freq" if row.layer_type is None else f"{row.layer_type}_inv_freq"
        theta = getattr(source.module, name, None)
        inexact = theta[torch.frexp(theta)[0].abs() != 0.5] if theta is not None else torch.ones(1)
        if not len(inexact):
            # powers of two only (DeepSeek-V4's tiny rotary of one pair, theta = 1): every float32
            # m theta is exact below 2^24, and its float32 cos and sin are within a unit
            assert worst <= 1, row
            return
        # half an ulp of m theta near 2^20 is 2^-25 m theta or more: m theta / 2 units of 2^-24;
        # the samples there reach a quarter of it (a pair whose theta is a power of two is exact)
        expected = min(FLOAT32_AT_2_20, row.limit * float(inexact.max()) / 8)
        if row.length is None:  # no configured length: every position counts as below it
            assert row.worst_beyond is None and row.worst_within > expected, row
        else:
            assert row.worst_beyond > expected and FLOAT32_AT_2_20 > row.worst_within, row


@pytest.mark.parametrize("model_type", [t for t in TYPES if t not in NO_ROTARY])
def test_stock_tables_show_their_float32_error(model_type):
    model = tiny(model_type)
    found = {source.name: source for source in tables.sources(model)}
    stock = rope.hf.diagnose(model)
    seen = {row.module for row in stock} | {copy for row in stock for copy in row.copies}
    assert seen == set(found)
    assert inv_freq_modules(model) <= seen  # every module with an inv_freq buffer is read or named
    leaders = {row.module for row in stock}  # one row per place (its copies named) and layer type
    assert sorted((row.module, row.layer_type or "") for row in stock) == sorted(
        (name, layer_type or "") for name in leaders for layer_type in tables.layer_types(found[name]))
    for row in stock:
        name = type(found[row.module].module).__name__
        if name in NOT_ROTARY_PLACES:
            assert row.limit is None and row.note, row
            continue
        assert row.limit is not None, (row, name)
        check_stock(row, found[row.module])


@pytest.mark.parametrize("model_type", sorted(NO_ROTARY))
def test_types_without_rotary_tables_are_refused_saying_so(model_type):
    with pytest.raises(ValueError, match="model: .* has no rotary tables"):
        rope.hf.diagnose(tiny(model_type))


@pytest.mark.parametrize("model_type", sorted(OPTIONS))
def test_rotary_option_off_has_no_rotary_tables(model_type):
    with pytest.raises(ValueError, match="has no rotary tables"):
        rope.hf.diagnose(tiny(model_type, rotary=False))


@pytest.mark.parametrize("model_type", [t for t in COVERED if t not in NO_ROTARY])  # V-JEPA 2: no table
def test_patched_tables_are_exact(model_type):
    model = tiny(model_type)
    on_text_path = text_path(model)
    rope.hf.patch(model)
    try:
        assert not text_path(model), "patch leaves a rotary module that a text forward calls"
        for row in rope.hf.diagnose(model):
            if row.reference != "rope's float32 frequencies":  # left in place: not on the text path
                assert row.module not in on_text_path and not set(row.copies) & on_text_path, row
                continue
            assert row.note == "" or row.form.startswith("called with an image"), row  # its configured grid
            worst = [v for v in (row.worst_within, row.worst_beyond) if v is not None]
            assert worst and max(worst) <= 0.5 and row.first_position is None, row
    finally:
        rope.hf.unpatch(model)


def test_rows_are_per_module_and_layer_type():
    types = {row.layer_type for row in rope.hf.diagnose(tiny("gemma4_text"))}
    assert types == {"sliding_attention", "full_attention"}
    (moshi,) = rope.hf.diagnose(tiny("moshi"))
    assert moshi.copies  # one rotary module per layer, the same tables: read once
    (gptj,) = rope.hf.diagnose(tiny("gptj"))  # one table per attention layer, the same: read once
    assert gptj.module.endswith("embed_positions") and len(gptj.copies) == tiny("gptj").config.n_layer - 1


def test_precomputed_tables_take_the_precision_of_their_formula():
    """GPT-J computes its angles in float32, RoFormer in float64 (numpy): each reference takes
    the frequencies of its own formula, written here from transformers' code."""
    (gptj,) = rope.hf.diagnose(tiny("gptj"))
    (roformer,) = rope.hf.diagnose(tiny("roformer"))
    assert "float32" in gptj.reference and "float64" in roformer.reference
    dim = tiny("gptj").config.rotary_dim
    ours = tables.default_frequencies(10000.0, dim, torch.float32)
    theirs = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.int64) / dim))  # create_sinusoidal_positions
    assert torch.equal(ours, theirs)


def _spacing(values: torch.Tensor, bits: int, attention: float = 1.0) -> torch.Tensor:
    """A format's spacing 2^(floor(log2 x) - bits) at x = max(|value|, a/2), written from the format
    (bits: 7 for bfloat16, 23 for float32)."""
    x = values.abs().clamp_min(attention / 2)
    return torch.exp2(torch.floor(torch.log2(x)) - bits)


def _bf16_spacing(values: torch.Tensor, attention: float = 1.0) -> torch.Tensor:
    return _spacing(values, 7, attention)


def _roundings(values: torch.Tensor, slack: torch.Tensor | float) -> list[torch.Tensor]:
    """The bfloat16 values a computation within ``slack`` of ``values`` can round to (the two ends'
    roundings; the interval is far narrower than bfloat16's spacing), as float64."""
    return [(values + s).to(torch.bfloat16).double() for s in (-slack, slack)]


def test_planted_bfloat16_frequencies_first_position_matches_the_formula():
    model = coverage.tiny_model("llama").to(torch.bfloat16)  # rounds inv_freq to bfloat16 (transformers #29496)
    config = model.config
    dim, base = config.head_dim, config.rope_parameters["rope_theta"]
    theta = torch.tensor([base ** (-2 * i / dim) for i in range(dim // 2)], dtype=torch.float64).float()
    rounded = theta.to(torch.bfloat16)
    assert torch.equal(model.model.rotary_emb.inv_freq, rounded)  # the planted bug is the one meant

    limit = 4095
    (row,) = rope.hf.diagnose(model, limit=limit)
    m = torch.arange(limit + 1, dtype=torch.float64)[:, None]
    exact = [torch.cos(m * theta.double()), torch.sin(m * theta.double())]
    formula = [torch.cos(m * rounded.double()), torch.sin(m * rounded.double())]
    # the model computes the formula's angle as a float32 product and float32 cos/sin: within
    # 2^-24 (m theta + 4) of it; each entry is then one of the bfloat16 roundings of that interval
    slack = 2.0**-24 * (m * theta.double().max() + 4)
    low, high = torch.zeros(limit + 1, dtype=torch.float64), torch.zeros(limit + 1, dtype=torch.float64)
    for e, f in zip(exact, formula):
        errors = [(value - e).abs() / _bf16_spacing(e) for value in _roundings(f, slack)]
        low = torch.maximum(low, torch.minimum(*errors).amax(dim=1))
        high = torch.maximum(high, torch.maximum(*errors).amax(dim=1))
    earliest = int((high > 0.5).nonzero()[0])
    latest = int((low > 0.5).nonzero()[0])
    assert 0 < earliest <= row.first_position <= latest < 64, (earliest, row.first_position, latest)
    assert row.previous_position == row.first_position - 1  # read densely there
    read = torch.tensor(precision.sample_positions(limit, config.max_position_embeddings))
    length = config.max_position_embeddings
    assert float(low[read[read < length]].max()) <= row.worst_within <= float(high[read[read < length]].max())
    assert float(low[read[read >= length]].max()) <= row.worst_beyond <= float(high[read[read >= length]].max())


class Bfloat16Tables(nn.Module):
    """A rotary module that builds its tables in bfloat16 (positions, angles, cos and sin), then
    returns them in x's dtype: the bug planted in a float32 model."""

    def __init__(self, original: nn.Module):
        super().__init__()
        self.config = original.config
        self.register_buffer("inv_freq", original.inv_freq.clone(), persistent=False)

    def forward(self, x, position_ids):
        angles = position_ids[..., None].to(torch.bfloat16) * self.inv_freq.to(torch.bfloat16)
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)


def _float32_units_at(values: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """``|values - exact|`` in float32 units (the spacing at max(``|exact|``, 1/2))."""
    return (values - exact).abs() / _spacing(exact, 23)


def test_planted_bfloat16_tables_are_found_at_position_1(monkeypatch):
    model = coverage.tiny_model("llama")
    monkeypatch.setattr(model.model, "rotary_emb", Bfloat16Tables(model.model.rotary_emb))
    (row,) = rope.hf.diagnose(model, limit=2**12)
    assert row.reference.startswith("its own inv_freq")  # its class takes no config: its own float32 buffer
    theta = model.model.rotary_emb.inv_freq.double()
    # the formula at position 1: cos and sin of bf16(theta_i) rounded to bfloat16, against exact
    # angles; in float32 units (2^-24 at [1/2, 1), at least that)
    at_one = max(float(((torch.cos(theta.to(torch.bfloat16).double()).to(torch.bfloat16).double()
                         - torch.cos(theta)).abs()).max()),
                 float(((torch.sin(theta.to(torch.bfloat16).double()).to(torch.bfloat16).double()
                         - torch.sin(theta)).abs()).max())) / 2.0**-24
    assert at_one > 100  # the formula says: off at position 1 by far more than half a unit
    assert row.first_position == 1 and row.worst_within >= 0.5 * at_one


def _round_to_bfloat16(module: nn.Module, name: str) -> torch.Tensor:
    """Plant the bug of a cast in one buffer of a float32 model: ``name`` in bfloat16. Returns the
    float32 original."""
    original = getattr(module, name).clone()
    setattr(module, name, original.to(torch.bfloat16))
    return original


def test_planted_bfloat16_frequencies_of_a_2d_vision_module_are_found_at_position_1():
    model = coverage.tiny_model("qwen2_vl_vision")
    theta = _round_to_bfloat16(model.rotary_pos_emb, "inv_freq").double()
    (row,) = rope.hf.diagnose(model, limit=2**12)
    assert row.form == "called with 2-D position ids [n, 2]" and row.reference == "its class rebuilt from its config"
    # its float32 cos and sin of the float32 angle 1 * bf16(theta_i), one unit each, against cos(theta_i)
    rounded = theta.to(torch.bfloat16).double()
    at_one = max(float(_float32_units_at(f(rounded), f(theta)).max()) for f in (torch.cos, torch.sin))
    assert at_one > 100
    assert row.first_position == 1 and row.worst_within >= at_one - 1


def test_planted_bfloat16_frequencies_of_a_sequence_module_are_found_at_position_1():
    model = tiny("wav2vec2-conformer")
    module = model.encoder.embed_positions
    original = _round_to_bfloat16(module, "inv_freq")
    try:
        (row,) = rope.hf.diagnose(model, limit=2**12)
    finally:
        module.inv_freq = original
    assert row.form.startswith("called with a sequence")
    # it computes the angle 1 * bf16(theta_i) and its cos and sin in bfloat16 (from float32 values)
    theta = original.double()
    rounded = theta.to(torch.bfloat16).double()
    at_one = max(float(torch.minimum(*[_float32_units_at(v, f(theta)) for v in _roundings(f(rounded), 2.0**-24)])
                       .max()) for f in (torch.cos, torch.sin))
    assert at_one > 100
    assert row.first_position == 1 and row.worst_within >= at_one


def test_planted_bfloat16_frequencies_of_an_image_grid_are_found_at_its_first_patch():
    model = coverage.tiny_model("dinov3_vit")
    theta = _round_to_bfloat16(model.rope_embeddings, "inv_freq").double()
    (row,) = rope.hf.diagnose(model)
    side = model.config.image_size // model.config.patch_size
    assert row.form == f"called with an image of {side}x{side} patches" and row.limit == side - 1
    # patch (i, i) at c = (2i + 1)/side - 1 turns by 2 pi c bf16(theta_j), within GRID_UNITS of it
    centre = (2 * torch.arange(side, dtype=torch.float64) + 1) / side - 1
    angles, planted = (2 * math.pi * centre[:, None] * t for t in (theta, theta.to(torch.bfloat16).double()))
    units = torch.maximum(*[_float32_units_at(f(planted), f(angles)).amax(dim=1) for f in (torch.cos, torch.sin)])
    assert float(units[0]) > GRID_UNITS + 100
    assert row.first_position == 0 and row.worst_within >= float(units.max()) - GRID_UNITS


def test_planted_bfloat16_sin_cos_table_is_found_at_position_1():
    model = coverage.tiny_model("gptj")
    for layer in model.transformer.h:  # each layer's table rounded to bfloat16, kept in float32
        layer.attn.embed_positions = layer.attn.embed_positions.to(torch.bfloat16).float()
    (row,) = rope.hf.diagnose(model)
    assert row.form == "a precomputed [sin | cos] table" and len(row.copies) == model.config.n_layer - 1
    dim = model.config.rotary_dim
    theta = torch.tensor([10000 ** (-2 * i / dim) for i in range(dim // 2)], dtype=torch.float64)
    # bf16 of its float32 sin and cos of 1 * theta_i: within 2^-24 of the exact ones before rounding;
    # the reference's frequencies (float32 or float64) differ from theta by 2^-24 theta: one unit more
    at_one = max(float(torch.minimum(*[_float32_units_at(v, f(theta)) for v in _roundings(f(theta), 2.0**-23)])
                       .max()) for f in (torch.cos, torch.sin))
    assert at_one > 100
    assert row.first_position == 1 and row.worst_within >= at_one - 1


def test_planted_bfloat16_complex_grid_table_is_found_at_its_first_position():
    model = coverage.tiny_model("llama4_vision_model")
    table = model.rotary_embedding.freqs_ci
    model.rotary_embedding.freqs_ci = torch.complex(table.real.to(torch.bfloat16).float(),
                                                    table.imag.to(torch.bfloat16).float())
    (row,) = rope.hf.diagnose(model)
    assert row.form.startswith("a precomputed complex table on a") and row.reference.startswith("base^(-2i/d)")
    # Llama 4 vision's patch (0, 0) is at position 1 on both axes: e^(i theta_j), theta_j = base^(-2j/d), d = head/2
    config = model.config
    d = config.hidden_size // config.num_attention_heads // 2
    base = config.rope_parameters["rope_theta"]
    theta = torch.tensor([base ** (-2 * j / d) for j in range(d // 2)], dtype=torch.float64)
    at_one = max(float(torch.minimum(*[_float32_units_at(v, f(theta)) for v in _roundings(f(theta), 2.0**-23)])
                       .max()) for f in (torch.cos, torch.sin))
    assert at_one > 100
    assert row.first_position == 1 and row.worst_within >= at_one - 1


def test_coordinate_encoder_cast_to_bfloat16_is_found_where_its_arithmetic_allows():
    model = coverage.tiny_model("lightglue").to(torch.bfloat16)
    limit = 255  # coordinates (p, p) exact in bfloat16
    (row,) = rope.hf.diagnose(model, limit=limit)
    assert row.form == "called with coordinates [1, n, 2]"
    weight = model.positional_encoder.projector.weight.double()  # [pairs, 2]: the learned frequencies
    p = torch.arange(limit + 1, dtype=torch.float64)[:, None]
    exact = p * weight.sum(dim=1)
    # its Linear sums p w_0 + p w_1 in float32 and rounds to bfloat16; cos and sin of that, rounded
    # from float32 to bfloat16: every candidate, and the error range it gives per position
    slack = 2.0**-23 * p * weight.abs().sum(dim=1)
    low, high = torch.zeros(limit + 1, dtype=torch.float64), torch.zeros(limit + 1, dtype=torch.float64)
    for f in (torch.cos, torch.sin):
        errors = [(value - f(exact)).abs() / _bf16_spacing(f(exact))
                  for angle in _roundings(exact, slack) for value in _roundings(f(angle), 2.0**-23)]
        low = torch.maximum(low, torch.stack(errors).amin(dim=0).amax(dim=1))
        high = torch.maximum(high, torch.stack(errors).amax(dim=0).amax(dim=1))
    earliest = int((high > 0.5).nonzero()[0])
    latest = int((low > 0.5).nonzero()[0])
    assert earliest <= row.first_position <= latest, (earliest, row.first_position, latest)


def test_patched_model_cast_to_bfloat16_stays_exact():
    model = coverage.tiny_model("qwen3")
    rope.hf.patch(model)
    try:
        model.to(torch.bfloat16)  # rope's module keeps float32 frequencies
        (row,) = rope.hf.diagnose(model)
        assert row.worst_within <= 0.5 and row.worst_beyond <= 0.5 and row.first_position is None
        assert "bfloat16" in str(rope.hf.diagnose(model))
    finally:
        rope.hf.unpatch(model)


def test_model_is_left_as_it_was_and_the_table_names_every_row():
    for model_type in ("gemma4_text", "gptj", "wav2vec2-conformer"):
        model = tiny(model_type)
        before = {name: buffer.clone() for name, buffer in model.named_buffers()}
        result = rope.hf.diagnose(model, threshold=1.0)
        assert all(torch.equal(buffer, before[name]) for name, buffer in model.named_buffers()), model_type
        table = result.table()
        assert str(result) == table and table.count("\n| `") == len(result)
        assert "first position > 1" in table
        assert all(f"| {row.layer_type or '-'} |" in table and row.form in table for row in result)
        assert result.dtype == torch.float32 and result.threshold == 1.0


def test_unread_places_say_why():
    rows = {row.module: row for row in rope.hf.diagnose(tiny("voxtral_realtime"))}
    assert rows["time_embedding"].limit is None and "TypeError" in rows["time_embedding"].note
    assert "not read: " in str(rope.hf.diagnose(tiny("voxtral_realtime")))
    assert rows["audio_tower.rotary_emb"].limit is not None


def test_sample_positions():
    positions = precision.sample_positions(2**20, length=5000)
    assert positions[: precision.DENSE] == list(range(precision.DENSE))
    assert {4999, 5000, 5001, 2**20} <= set(positions) and positions == sorted(set(positions))
    octaves = math.log2(2**20 / precision.DENSE)
    assert len(positions) <= precision.DENSE + precision.PER_OCTAVE * octaves + 4


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [({"model": "llama"}, TypeError, "model"),
     ({"model": nn.Linear(2, 2)}, ValueError, "model"),
     ({"dtype": torch.int32}, ValueError, "dtype"),
     ({"dtype": "bfloat16"}, TypeError, "dtype"),
     ({"limit": 3}, ValueError, "limit"),
     ({"limit": 2.0**20}, TypeError, "limit"),
     ({"threshold": -1.0}, ValueError, "threshold"),
     ({"threshold": "0.5"}, TypeError, "threshold")],
)
def test_bad_arguments_are_refused_by_name(kwargs, error, name):
    arguments = {"model": tiny("llama"), **kwargs}
    with pytest.raises(error, match=name):
        rope.hf.diagnose(arguments.pop("model"), **arguments)
