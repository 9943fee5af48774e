"""rope.hf.diagnose on tiny random models (no download) of every type of
rope.hf.coverage_table.COVERED, one model per type shared by the tests:

* stock, every rotary module and layer type is read, and transformers' float32 angles show:
  past some position the error exceeds half a unit, and at 2^20 it is thousands of units; a
  position table (GPT-J, CodeGen) is read at every position it holds, and shows them too;
* patched (rope.hf.patch), the tables are exact: within half a unit at every position read, for
  every rotary module a text forward calls and every vision tower's that rope reproduces (the
  others stay as they were);
* a planted bug is found: a model cast to bfloat16 (its inv_freq rounded to bfloat16,
  transformers issue #29496) reports the first position where its error exceeds half a unit
  within the band that the formula cos(m bf16(theta_i)), computed here, allows for the model's
  float32 arithmetic; a rotary module whose tables are built in bfloat16 is found at position 1;
* the model is left as it was, and bad arguments are refused by name.
"""

import math

import pytest
import torch
from torch import nn

import rope
from rope.hf import precision

transformers = pytest.importorskip("transformers")
from rope.hf import coverage, coverage_table  # noqa: E402

COVERED = sorted(coverage_table.COVERED)
FLOAT32_AT_2_20 = 1000
"""transformers' float32 angle m theta at m near 2^20 and theta near 1 is off by up to 2^-5 rad:
tens of thousands of float32 units (2^-24); fewer rotary pairs (partial rotary) see fewer such
angles, but each table has a pair of theta = 1."""

_MODELS: dict = {}


def tiny(model_type: str) -> nn.Module:
    """One tiny model per type for the whole module (built once, shared by the tests)."""
    if model_type not in _MODELS:
        _MODELS[model_type] = coverage.tiny_model(model_type)
    return _MODELS[model_type]


def rows_expected(model: nn.Module) -> int:
    """How many (module, layer type) rows a model has, counted here from its modules: every
    module with an inv_freq buffer, one row per ``<layer type>_inv_freq`` where it has those
    (rope's LayerTypeRotaryEmbedding holds one module with inv_freq per layer type), and one per
    position table buffer."""
    count = 0
    for _, module in model.named_modules():
        buffers = [name for name, _ in module.named_buffers(recurse=False) if name.endswith("inv_freq")]
        types = [t for t in getattr(module, "layer_types", None) or () if f"{t}_inv_freq" in buffers]
        count += len(types) or bool(buffers)
        count += sum(name in rope.hf.POSITION_TABLES for name, _ in module.named_buffers(recurse=False))
    return count


def position_tables(model: nn.Module) -> dict[str, int]:
    """The model's position table buffers by qualified name, with their rows."""
    return {name: buffer.shape[0] for name, buffer in model.named_buffers()
            if name.rsplit(".", 1)[-1] in rope.hf.POSITION_TABLES}


def configured_length(model: nn.Module, name: str) -> int | None:
    """max_position_embeddings of the config the rotary module ``name`` holds (a part's, e.g. an
    audio encoder's), else of the model's text config."""
    config = getattr(model.get_submodule(name), "config", None) or model.config.get_text_config()
    return getattr(config, "max_position_embeddings", None)


def text_path(model: nn.Module) -> set[str]:
    """The rotary modules the probe's forward calls (rope.hf.coverage.output: token ids, or the
    part and inputs rope.hf.coverage_table.FEEDS records; hooks: rope.hf.coverage)."""
    calls = coverage.stock_rotary_calls(model)
    try:
        coverage.output(model, coverage.sample_tokens())
    finally:
        called = calls.close()
    return {name for name, _ in called}


@pytest.mark.parametrize("model_type", COVERED)
def test_stock_tables_show_float32_angles_and_patched_are_exact(model_type):
    model = tiny(model_type)
    found = precision.rotary_modules(model) + precision.position_tables(model)
    tables = position_tables(model)
    on_text_path = text_path(model)
    stock = rope.hf.diagnose(model)
    seen = {row.module for row in stock} | {copy for row in stock for copy in row.copies}
    assert seen == {name for name, _ in found}
    assert len(stock) + sum(len(row.copies) for row in stock) == rows_expected(model)
    for row in stock:
        if row.module in tables:  # every position the table holds, against rope's frequencies of its config
            assert row.note == "" and row.reference == "rope's float32 frequencies of its config", row
            assert row.limit == tables[row.module] - 1 and row.worst_beyond is None and row.first_position, row
            continue
        if row.module not in on_text_path and row.note:  # e.g. a vision tower's 2D module: not read
            continue
        length = configured_length(model, row.module)
        assert row.note == "" and row.reference == "its class rebuilt from its config", row
        assert row.limit == max(2**20, 4 * (length or 0)) and row.length == length
        assert row.first_position is not None and row.first_position <= row.worst_position
        if length is None:  # no configured length: every position counts as below it
            assert row.worst_beyond is None and row.worst_within > FLOAT32_AT_2_20, row
        else:
            assert row.worst_beyond > FLOAT32_AT_2_20 > row.worst_within, row
    rope.hf.patch(model)
    try:
        assert not text_path(model), "patch leaves a rotary module that a text forward calls"
        patched = rope.hf.diagnose(model)
        assert len(patched) + sum(len(row.copies) for row in patched) == rows_expected(model)
        for row in patched:
            left = row.reference != "rope's float32 frequencies" and row.module not in tables
            if left:  # left in place: not on the text path
                assert row.module not in on_text_path and not set(row.copies) & on_text_path, row
                continue
            assert row.note == "", row
            worst = [v for v in (row.worst_within, row.worst_beyond) if v is not None]
            assert worst and max(worst) <= 0.5 and row.first_position is None, row
    finally:
        rope.hf.unpatch(model)


def test_rows_are_per_module_and_layer_type():
    for model_type in ("llama", "gemma4_text", "modernbert", "moshi"):
        model = tiny(model_type)
        rows = rope.hf.diagnose(model)
        assert len(rows) + sum(len(row.copies) for row in rows) == rows_expected(model), model_type
    types = {row.layer_type for row in rope.hf.diagnose(tiny("gemma4_text"))}
    assert types == {"sliding_attention", "full_attention"}
    (moshi,) = rope.hf.diagnose(tiny("moshi"))
    assert moshi.copies  # one rotary module per layer, the same tables: read once


def _bf16_spacing(values: torch.Tensor, attention: float = 1.0) -> torch.Tensor:
    """bfloat16's spacing 2^(floor(log2 x) - 7) at x = max(|value|, a/2), written from its format."""
    x = values.abs().clamp_min(attention / 2)
    return torch.exp2(torch.floor(torch.log2(x)) - 7)


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
        errors = [((f + s).to(torch.bfloat16).double() - e).abs() / _bf16_spacing(e) for s in (-slack, slack)]
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
    model = tiny("gemma4_text")
    before = {name: buffer.clone() for name, buffer in model.named_buffers()}
    result = rope.hf.diagnose(model, threshold=1.0)
    assert all(torch.equal(buffer, before[name]) for name, buffer in model.named_buffers())
    table = result.table()
    assert str(result) == table and table.count("\n| `") == len(result)
    assert "first position > 1" in table
    assert all(f"| {row.layer_type} |" in table for row in result)
    assert result.dtype == torch.float32 and result.threshold == 1.0


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
