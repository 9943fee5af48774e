"""rope.hf.vision: exact tables for transformers' vision rotary modules, and rope.hf.patch on
vision-language models.

For every axial vision rotary class of the installed transformers (each modeling module that
defines ``compute_axial_rope_parameters``, found by reading the sources), built from a tiny
config of its family (rope.hf.coverage.tiny_config), and for Llama 4's complex table:

* rope's tables against cos and sin of p theta_j in exact arithmetic (mpmath at 200 bits), with
  theta_j = b^(-j/n) from the axial formula, correctly rounded to float32 here, laid out by the
  class's own recomposition_frequencies: within half a float32 ulp, at positions from 0 to past
  2^17 (and SAM 3's fractional positions);
* rope's tables against the class's own at small positions: float32 noise, same shapes and dtypes.

Then rope.hf.patch on tiny Qwen2-VL, GLM-4V and Llama 4: the vision towers' rotary modules are
swapped, a vision forward is transformers' to float32 noise, and unpatch restores the model
bit for bit; on a vision tower alone (Qwen2-VL's, GLM-4V's, Pixtral's, SAM 3's ViT) likewise,
with its modeling module's function; rope's vision functions (apply_rotary_pos_emb_vision, its
pairwise form, apply_rotary_pos_emb_2d) against the float64 formula. Refusals name their reason.
"""

import copy
import importlib
import pathlib
import re
import typing
import warnings

import pytest
import torch

import rope

transformers = pytest.importorskip("transformers")
mpmath = pytest.importorskip("mpmath")
from helpers import assert_correctly_rounded, exact_cos_sin, round_exact, to_fraction  # noqa: E402
from rope.hf import coverage, vision  # noqa: E402

MODELS = pathlib.Path(transformers.__file__).parent / "models"


def axial_classes() -> list[tuple[str, str]]:
    """(modeling module, class) of every class whose body defines compute_axial_rope_parameters,
    read from the sources (the class enclosing each definition)."""
    found = []
    for path in sorted(MODELS.glob("*/modeling_*.py")):
        source = path.read_text()
        for match in re.finditer(r"\n    def compute_axial_rope_parameters\(", source):
            enclosing = list(re.finditer(r"\nclass (\w+)\(", source[: match.start()]))[-1].group(1)
            found.append((f"transformers.models.{path.parent.name}.{path.stem}", enclosing))
    return found


CLASSES = axial_classes()
EVEN_ODD = {"PixtralVisionRotaryEmbedding"}
"""Classes whose inv_freq holds theta_0, theta_2, ... then theta_1, theta_3, ... (Pixtral's source:
``torch.cat([inv_freq[0::2], inv_freq[1::2]])``)."""

BATCHED = {"Gemma4VisionRotaryEmbedding"}
"""Classes called with position ids [batch, N, 2] (Gemma 4's pixel_position_ids); the others [N, 2]."""


def stock(module_name: str, class_name: str) -> torch.nn.Module:
    """The class built from a tiny config of the config class its __init__ takes."""
    cls = getattr(importlib.import_module(module_name), class_name)
    config_class = typing.get_type_hints(cls.__init__)["config"]
    config = coverage.tiny_config(config_class.model_type)
    assert type(config) is config_class
    return cls(config)


def axial_theta(base: float, pairs: int, even_odd: bool) -> torch.Tensor:
    """theta_j = b^(-j/n), j = 0 .. n - 1, correctly rounded to float32 (Pixtral's order where asked)."""
    with mpmath.workprec(200):
        theta = [round_exact(to_fraction(mpmath.mpf(base) ** (-mpmath.mpf(j) / pairs)), torch.float32)
                 for j in range(pairs)]
    theta = torch.tensor(theta, dtype=torch.float32)
    return torch.cat([theta[0::2], theta[1::2]]) if even_odd else theta


def positions(gen: torch.Generator, rows: int, high: int, batched: bool) -> torch.Tensor:
    ids = torch.randint(0, high, (rows, 2), generator=gen)
    return ids[None] if batched else ids


def test_the_sources_give_the_classes():
    names = {name for _, name in CLASSES}
    assert len(CLASSES) >= 30 and len(names) == len(CLASSES)
    assert {"Qwen2VLVisionRotaryEmbedding", "PixtralVisionRotaryEmbedding", "Gemma4VisionRotaryEmbedding",
            "MiniMaxM3VLVisionRotaryEmbedding", "Sam3ViTRotaryEmbedding", "MLCDRotaryEmbedding"} <= names


@pytest.mark.parametrize("module_name, class_name", CLASSES, ids=[name for _, name in CLASSES])
def test_tables_are_exact_and_the_model_s(module_name, class_name):
    old = stock(module_name, class_name)
    new = vision.reproduce("m", old)
    assert isinstance(new, vision.VisionRotaryEmbedding) and new.position_dims == (2 if class_name in BATCHED else 1)
    base, pairs = old.config.rope_parameters["rope_theta"], old.inv_freq.numel()
    theta = axial_theta(base, pairs, class_name in EVEN_ODD)
    assert torch.equal(new.inv_freq, theta)
    assert ((old.inv_freq.double() - theta.double()).abs() <= 4 * 2.0**-23 * theta.double()).all()

    gen = torch.Generator().manual_seed(sum(map(ord, class_name)))
    batched = class_name in BATCHED
    far = positions(gen, 20, 2**17 + 2**12, batched)
    edges = torch.tensor([[0, 2**16], [2**16 - 1, 1], [2**16 + 1, 2**17 + 3]])
    far = torch.cat([far, edges[None] if batched else edges], dim=-2)
    cos, sin = new(torch.zeros(1), far)
    layout = type(old).recomposition_frequencies
    exact_cos, exact_sin = exact_cos_sin(far, theta)  # [..., 2, n]: axis a, frequency j
    scale = old.attention_scaling
    assert cos.dtype == torch.float32
    assert_correctly_rounded(cos, layout(old, exact_cos * scale))
    assert_correctly_rounded(sin, layout(old, exact_sin * scale))

    near = positions(gen, 24, 64, batched)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.zeros(1, dtype=dtype)
        theirs, ours = old(x, near), new(x, near)
        for a, b in zip(theirs, ours):
            assert a.shape == b.shape and a.dtype == b.dtype
            torch.testing.assert_close(b, a, rtol=0, atol=2e-5 if dtype == torch.float32 else 2.0**-8)


def test_fractional_positions_are_exact():
    """SAM 3's global layers scale an integer grid by window / grid (float positions): the angle
    of the float32 position, as given, exactly."""
    old = stock("transformers.models.sam3.modeling_sam3", "Sam3ViTRotaryEmbedding")
    new = vision.reproduce("m", old)
    gen = torch.Generator().manual_seed(3)
    steps = torch.randint(0, 2**20, (24, 2), generator=gen)
    ids = (steps * (24 / 72)).to(torch.float32)
    assert not torch.equal(ids, ids.round())
    exact_cos, exact_sin = exact_cos_sin(ids, new.inv_freq)
    layout = type(old).recomposition_frequencies
    cos, sin = new(torch.zeros(1), ids)
    assert_correctly_rounded(cos, layout(old, exact_cos))
    assert_correctly_rounded(sin, layout(old, exact_sin))
    integers = torch.randint(-2**40, 2**40, (6, 2), generator=gen)
    for a, b in zip(new(torch.zeros(1), integers.double()), new(torch.zeros(1), integers)):
        assert torch.equal(a, b)


def test_llama4_complex_table_is_exact_and_the_model_s():
    from transformers.models.llama4.modeling_llama4 import Llama4VisionRotaryEmbedding

    config = coverage.tiny_config("llama4").vision_config
    old = Llama4VisionRotaryEmbedding(config)
    new = vision.reproduce("m", old)
    assert isinstance(new, vision.VisionComplexRotaryEmbedding)
    side, head_dim = config.image_size // config.patch_size, config.hidden_size // config.num_attention_heads
    index = torch.arange(side * side)
    xy = torch.cat([torch.stack([index % side + 1, index // side + 1], dim=-1), torch.zeros(1, 2, dtype=torch.int64)])
    theta = axial_theta(config.rope_parameters["rope_theta"], head_dim // 4, False)
    cos, sin = exact_cos_sin(xy, theta)  # [patches + 1, 2, n]: x then y
    table = new(torch.zeros(1))
    assert table.dtype == torch.complex64 and table.shape == (side * side + 1, 1, head_dim // 2)
    assert_correctly_rounded(table.real[:, 0], cos.flatten(1))
    assert_correctly_rounded(table.imag[:, 0], sin.flatten(1))
    torch.testing.assert_close(table, old(torch.zeros(1)), rtol=0, atol=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the table is not cast (torch would warn of a complex table cast to real)
        assert new.to(torch.bfloat16).freqs_ci.dtype == torch.complex64


def vision_output(model, grid):
    """The vision tower's output on random patches of ``grid`` ([1, 3]: t, h, w)."""
    config = model.visual.config
    gen = torch.Generator().manual_seed(int(grid.sum()))
    pixels = torch.randn(int(grid.prod()), config.in_channels * config.temporal_patch_size * config.patch_size**2,
                         generator=gen)
    with torch.no_grad():
        return model.visual(pixels, grid_thw=grid).last_hidden_state


@pytest.mark.parametrize("model_type", ["qwen2_vl", "glm4v", "llama4"])
def test_patch_swaps_the_vision_rotary_modules_and_unpatch_restores_them(model_type):
    model = coverage.tiny_model(model_type)
    modules, state = dict(model.named_modules()), copy.deepcopy(model.state_dict())
    stock_names = [name for name, _ in vision.vision_rotary_modules(model)]
    assert len(stock_names) == 1
    grid = torch.tensor([[1, 8, 12]])
    expected = vision_output(model, grid) if model_type != "llama4" else None
    record = rope.hf.patch(model)
    try:
        assert [r.name for r in record.vision_modules] == stock_names and record.vision_left == ()
        assert isinstance(model.get_submodule(stock_names[0]), vision.VISION_MODULES)
        assert all(r.old is modules[r.name] for r in record.vision_modules)
        if expected is not None:
            calls = []
            hook = model.get_submodule(stock_names[0]).register_forward_hook(lambda *args: calls.append(1))
            got = vision_output(model, grid)
            hook.remove()
            assert calls and got.shape == expected.shape
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    finally:
        rope.hf.unpatch(model)
    now = dict(model.named_modules())
    assert now.keys() == modules.keys() and all(now[name] is modules[name] for name in modules)
    after = model.state_dict()
    assert after.keys() == state.keys() and all(torch.equal(after[k], state[k]) for k in state)
    if expected is not None:
        assert torch.equal(vision_output(model, grid), expected)


def test_install_leaves_a_vision_rotary_emb_to_patch():
    """Step 3.7 names its vision module rotary_emb: install swaps the text one only, and a vision
    model alone has nothing install swaps."""
    model = coverage.tiny_model("step3p7")
    held = model.vision_model.rotary_emb
    assert rope.hf.install(model) == 1
    assert model.vision_model.rotary_emb is held
    assert isinstance(model.language_model.rotary_emb, (rope.hf.RotaryEmbedding, rope.hf.LayerTypeRotaryEmbedding))
    with pytest.raises(ValueError, match="no submodule named rotary_emb nor a position table .* but vision rotary"):
        rope.hf.install(model.vision_model)


def test_diagnose_reads_the_vision_tables():
    model = coverage.tiny_model("qwen2_vl")
    stock_row = rope.hf.diagnose(model, limit=2**17)[0]
    assert stock_row.module == "visual.rotary_pos_emb" and stock_row.first_position < 16
    rope.hf.patch(model)
    try:
        row = rope.hf.diagnose(model, limit=2**17)[0]
    finally:
        rope.hf.unpatch(model)
    assert row.module == "visual.rotary_pos_emb" and row.limit == 2**17
    assert row.first_position is None and row.worst_within <= 0.5


class Shifted(transformers.models.qwen2_vl.modeling_qwen2_vl.Qwen2VLVisionRotaryEmbedding):
    """A forward that turns every patch one position further than the axial form."""

    def forward(self, x, position_ids):
        return super().forward(x, position_ids + 1)


class Doubled(transformers.models.qwen2_vl.modeling_qwen2_vl.Qwen2VLVisionRotaryEmbedding):
    """A layout that scales the tables: not a rearrangement."""

    def recomposition_frequencies(self, freq):
        return 2 * super().recomposition_frequencies(freq)


def qwen2_vl_vision(cls=None, **sizes):
    config = coverage.tiny_config("qwen2_vl_vision")
    for key, value in sizes.items():
        setattr(config, key, value)
    return (cls or transformers.models.qwen2_vl.modeling_qwen2_vl.Qwen2VLVisionRotaryEmbedding)(config)


def retyped():
    module = qwen2_vl_vision()
    module.config.rope_parameters = {**module.config.rope_parameters, "rope_type": "default"}
    return module


REFUSALS = [
    pytest.param(lambda: qwen2_vl_vision(embed_dim=36), r"its inv_freq\[1\] = .* is not rope's axial frequency "
                 r"b\^\(-1/5\)", id="odd half-width"),
    pytest.param(lambda: qwen2_vl_vision().to(torch.bfloat16), "its inv_freq is bfloat16, not float32 "
                 r"\(the model was cast", id="cast"),
    pytest.param(retyped, "its config's rope_type is 'default', not 'axial'", id="rope_type"),
    pytest.param(lambda: qwen2_vl_vision(Doubled), "its recomposition_frequencies is not a rearrangement",
                 id="layout"),
    pytest.param(lambda: qwen2_vl_vision(Shifted), "tables off by .* at probe positions: its forward is not the "
                 "axial form", id="forward"),
    pytest.param(lambda: torch.nn.Linear(2, 2), "it is not a vision rotary module", id="not vision"),
]


@pytest.mark.parametrize("build, message", REFUSALS)
def test_refusals_name_the_reason(build, message):
    module = build()
    with pytest.raises(ValueError, match=r"vision: m \(\w+\) is not reproduced: " + message):
        vision.reproduce("m", module)


def test_patch_leaves_a_vision_module_it_does_not_reproduce_and_says_why():
    model = coverage.tiny_model("qwen2_vl")
    held = Shifted(model.visual.rotary_pos_emb.config)
    model.visual.rotary_pos_emb = held
    with pytest.warns(UserWarning, match=r"visual.rotary_pos_emb \(Shifted\) is not reproduced"):
        record = rope.hf.patch(model)
    try:
        assert record.vision_modules == () and [name for name, _ in record.vision_left] == ["visual.rotary_pos_emb"]
        assert model.visual.rotary_pos_emb is held and isinstance(model.language_model.rotary_emb,
                                                                  rope.hf.RotaryEmbedding)
    finally:
        rope.hf.unpatch(model)
    assert model.visual.rotary_pos_emb is held


def test_unpatch_refuses_a_vision_module_replaced_since():
    model = coverage.tiny_model("glm4v")
    record = rope.hf.patch(model)
    ours = model.visual.rotary_pos_emb
    model.visual.rotary_pos_emb = torch.nn.Identity()
    with pytest.raises(ValueError, match=r"\['visual.rotary_pos_emb'\] are no longer the rotary modules"):
        rope.hf.unpatch(model)
    assert isinstance(model.language_model.rotary_emb, rope.hf.RotaryEmbedding)
    model.visual.rotary_pos_emb = ours
    rope.hf.unpatch(model)
    assert model.visual.rotary_pos_emb is record.vision_modules[0].old


BAD_CALLS = [
    pytest.param(lambda: (torch.zeros(1), torch.zeros(3, 2, dtype=torch.bool)), TypeError, "position_ids", id="bool"),
    pytest.param(lambda: (torch.zeros(1), torch.tensor([[0.0, float("nan")]])), ValueError, "position_ids",
                 id="nan"),
    pytest.param(lambda: (torch.zeros(1, dtype=torch.int64), torch.zeros(3, 2, dtype=torch.int64)), TypeError, "x",
                 id="integer x"),
    pytest.param(lambda: (torch.zeros(1), [[0, 1]]), TypeError, "position_ids", id="list"),
]


@pytest.mark.parametrize("arguments, error, name", BAD_CALLS)
def test_bad_arguments_are_refused_by_name(arguments, error, name):
    new = vision.reproduce("m", qwen2_vl_vision())
    with pytest.raises(error, match=rf"^{name} "):
        new(*arguments())


def test_casts_keep_the_float32_frequencies():
    new = vision.reproduce("m", qwen2_vl_vision())
    theta = new.inv_freq.clone()
    new.to(torch.bfloat16).half()
    assert new.inv_freq.dtype == torch.float32 and torch.equal(new.inv_freq, theta)
    cos, _ = new(torch.zeros(1, dtype=torch.bfloat16), torch.zeros(2, 2, dtype=torch.int64))
    assert cos.dtype == torch.float32


def _vision_reference(q, cos, sin, pairwise, heads=True):
    """q cos + rotate(q) sin in float64, tables unsqueezed at -2 where q has heads after seq:
    rotate_half (x1, x2) -> (-x2, x1) on the halves, or pairwise (x_2i, x_2i+1) -> (-x_2i+1, x_2i)."""
    q, cos, sin = q.double(), cos.double(), sin.double()
    if heads:
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    if pairwise:
        turned = torch.stack((-q[..., 1::2], q[..., 0::2]), dim=-1).flatten(-2)
    else:
        half = q.shape[-1] // 2
        turned = torch.cat((-q[..., half:], q[..., :half]), dim=-1)
    return q * cos + turned * sin


VISION_FUNCTIONS = {"apply_rotary_pos_emb_vision": ("qwen2_vl_vision", False, True),
                    "apply_rotary_pos_emb_vision_pairwise": ("inkling2_vision", True, True),
                    "apply_rotary_pos_emb_2d": ("sam3_vit_model", True, False)}
"""rope's vision functions: (a model type whose modeling module has transformers' function, pairs
(2i, 2i + 1), q [seq, heads, dim] with tables unsqueezed at -2 (else q [heads, seq, dim], tables
broadcast as given))."""


@pytest.mark.parametrize("name", list(VISION_FUNCTIONS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vision_functions_round_the_exact_formula_once(name, dtype):
    """rope's vision functions on random q, k and tables [seq, dim]: every output within half an
    ulp of its input's dtype of the float64 formula (rounded once), and transformers' function to
    float32 noise."""
    model_type, pairwise, heads = VISION_FUNCTIONS[name]
    gen = torch.Generator().manual_seed(len(name))
    q, k = (torch.randn(*((24, 3) if heads else (3, 24)), 16, generator=gen).to(dtype) for _ in range(2))
    angles = torch.rand(24, 16, generator=gen, dtype=torch.float64) * 2000
    cos, sin = angles.cos().float(), angles.sin().float()
    got = getattr(rope.hf, name)(q, k, cos, sin)
    for x, out in zip((q, k), got):
        assert out.dtype == dtype
        assert_correctly_rounded(out, _vision_reference(x, cos, sin, pairwise, heads))
    theirs = importlib.import_module(coverage.module_name(model_type))
    function = theirs.apply_rotary_pos_emb_2d if name.endswith("2d") else theirs.apply_rotary_pos_emb_vision
    for a, b in zip(got, function(q, k, cos, sin)):
        torch.testing.assert_close(a.float(), b.float(), rtol=1e-5, atol=1e-5 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("model_type", ["qwen2_vl_vision", "glm4v_vision", "pixtral", "sam3_vit_model"])
def test_patch_takes_a_vision_tower_alone(model_type):
    """A vision tower alone (no rotary_emb): patch swaps its vision rotary module and its modeling
    module's function; a forward calls rope's module; unpatch restores both."""
    model = coverage.tiny_model(model_type)
    module = importlib.import_module(coverage.module_name(model_type))
    convention = rope.hf.FAMILIES[model_type]
    originals = [getattr(module, name) for name, _ in convention.functions]
    held = dict(vision.vision_rotary_modules(model))
    assert held
    record = rope.hf.patch(model)
    try:
        assert record.rotary_modules == () and [r.name for r in record.vision_modules] == list(held)
        assert record.module is module and not vision.vision_rotary_modules(model)
        assert all(isinstance(model.get_submodule(name), vision.VISION_MODULES) for name in held)
        assert all(getattr(module, n) is ours for n, ours in convention.functions)
    finally:
        rope.hf.unpatch(model)
    assert all(model.get_submodule(name) is module for name, module in held.items())
    assert [getattr(module, n) for n, _ in convention.functions] == originals


def test_patch_refuses_a_vision_tower_whose_module_it_does_not_reproduce():
    model = coverage.tiny_model("qwen2_vl_vision")
    module = importlib.import_module(coverage.module_name("qwen2_vl_vision"))
    function = module.apply_rotary_pos_emb_vision
    held = Shifted(model.rotary_pos_emb.config)
    model.rotary_pos_emb = held
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match=r"are vision ones, and vision: rotary_pos_emb \(Shifted\) is not "
                                             r"reproduced.*nothing changed"):
            rope.hf.patch(model)
    assert model.rotary_pos_emb is held and module.apply_rotary_pos_emb_vision is function


@pytest.mark.parametrize("name", list(VISION_FUNCTIONS))
def test_vision_functions_refuse_bad_tables_by_name(name):
    function = getattr(rope.hf, name)
    q = torch.randn(24, 3, 16)
    cos = torch.randn(24, 16)
    with pytest.raises(ValueError, match=r"sin \(24, 8\) must have the shape of cos"):
        function(q, q, cos, cos[:, :8])
    with pytest.raises(ValueError, match="cos has width 18, expected an even width"):
        function(q, q, torch.randn(24, 18), torch.randn(24, 18))
    with pytest.raises(TypeError, match="q"):
        function(q.long(), q, cos, cos)
