"""rope.hf.patch and rope.hf.unpatch on the earlier families of rope.hf.FAMILIES (the tiny models of
tests/test_hf_families.py). After patch the logits are transformers' own, to the family test's
tolerance. After unpatch they are bit for bit the original logits, and the model's modules and
the modeling module's functions are the original objects again. Refusals change nothing.
Reference logits always come from transformers' own, unpatched model."""

import gc
import inspect
import sys
import types

import pytest
import torch

import rope

transformers = pytest.importorskip("transformers")
from transformers.models.llama import modeling_llama  # noqa: E402

from test_hf_families import (  # noqa: E402
    CASES,
    LOGITS_TOLERANCE,
    family_tokens,
    sample_tokens,
    tiny_config,
    tiny_model,
)


def modeling_module(model):
    return sys.modules[type(model).__module__]


def functions(module, model_type):
    """The modeling module's current functions of the family's convention, by name."""
    return {name: getattr(module, name) for name, _ in rope.hf.FAMILIES[model_type].functions}


def snapshot(model):
    """The model's submodules by name, and the Llama modeling module's function: what a refusal
    must leave as it was (compared by identity)."""
    return dict(model.named_modules()), modeling_llama.apply_rotary_pos_emb


def assert_unchanged(model, before):
    modules, function = before
    now = dict(model.named_modules())
    assert now.keys() == modules.keys() and all(now[name] is modules[name] for name in modules)
    assert modeling_llama.apply_rotary_pos_emb is function


def logits(model, tokens):
    with torch.no_grad():
        return model(tokens).logits


@pytest.mark.parametrize("model_type, options", CASES)
def test_patch_reproduces_transformers_and_unpatch_restores_it(model_type, options):
    model = tiny_model(model_type, **options)
    tokens = family_tokens(model_type)
    expected = logits(model, tokens)
    assert expected.abs().max() > 0.1
    module, convention = modeling_module(model), rope.hf.FAMILIES[model_type]
    original_functions, original_modules = functions(module, model_type), dict(model.named_modules())

    record = rope.hf.patch(model)
    try:
        assert record.model_type == model_type and record.convention is convention and record.module is module
        assert all(getattr(module, name) is ours for name, ours in convention.functions)
        assert all(original_functions[name] is function for name, function in record.originals)
        assert record.rotary_modules and all(r.old is original_modules[r.name] for r in record.rotary_modules)
        for r in record.rotary_modules:
            assert model.get_submodule(r.name) is r.new and r.new.tables == convention.tables
        torch.testing.assert_close(logits(model, tokens), expected, **LOGITS_TOLERANCE)
    finally:
        rope.hf.unpatch(model)

    assert all(function is original_functions[name] for name, function in functions(module, model_type).items())
    now = dict(model.named_modules())
    assert now.keys() == original_modules.keys() and all(now[name] is original_modules[name] for name in now)
    assert torch.equal(logits(model, tokens), expected)


def test_patch_twice_and_unpatch_twice():
    model = tiny_model("llama")
    record = rope.hf.patch(model)
    patched = snapshot(model)
    with pytest.raises(ValueError, match="patch: this LlamaForCausalLM is patched already; call rope.hf.unpatch"):
        rope.hf.patch(model)
    assert_unchanged(model, patched)
    with pytest.raises(ValueError, match="shares modules with a patched LlamaForCausalLM"):
        rope.hf.patch(model.model)  # the decoder inside the patched model
    assert_unchanged(model, patched)
    assert rope.hf.unpatch(model) is None
    unpatched = snapshot(model)
    assert model.model.rotary_emb is record.rotary_modules[0].old
    with pytest.raises(ValueError, match="unpatch: this LlamaForCausalLM is not patched .*nothing changed"):
        rope.hf.unpatch(model)
    assert_unchanged(model, unpatched)


def test_two_models_of_a_family():
    """The modeling module's function is the process's: the first unpatch leaves rope's function
    in place for the other model, the last one restores the original."""
    first, second = tiny_model("llama"), tiny_model("llama")
    tokens = family_tokens("llama")
    expected = logits(first, tokens)
    original = modeling_llama.apply_rotary_pos_emb
    first_record, second_record = rope.hf.patch(first), rope.hf.patch(second)
    assert first_record.originals == second_record.originals == (("apply_rotary_pos_emb", original),)
    rope.hf.unpatch(first)
    assert modeling_llama.apply_rotary_pos_emb is rope.hf.apply_rotary_pos_emb
    assert first.model.rotary_emb is first_record.rotary_modules[0].old
    for model in (first, second):  # rope's function on transformers' tables, and on rope's
        torch.testing.assert_close(logits(model, tokens), expected, **LOGITS_TOLERANCE)
    rope.hf.unpatch(second)
    assert modeling_llama.apply_rotary_pos_emb is original
    for model in (first, second):
        assert torch.equal(logits(model, tokens), expected)


def test_a_collected_patched_model_releases_the_module():
    original = modeling_llama.apply_rotary_pos_emb
    model = tiny_model("llama")
    rope.hf.patch(model)
    assert modeling_llama.apply_rotary_pos_emb is rope.hf.apply_rotary_pos_emb
    del model
    gc.collect()
    assert modeling_llama.apply_rotary_pos_emb is original
    again = tiny_model("llama")  # and the bookkeeping starts afresh
    rope.hf.patch(again)
    rope.hf.unpatch(again)
    assert modeling_llama.apply_rotary_pos_emb is original


def test_patch_after_install_keeps_the_installed_modules():
    model = tiny_model("llama")
    assert rope.hf.install(model) == 1
    installed = model.model.rotary_emb
    record = rope.hf.patch(model)
    assert record.rotary_modules == () and modeling_llama.apply_rotary_pos_emb is rope.hf.apply_rotary_pos_emb
    rope.hf.unpatch(model)
    assert model.model.rotary_emb is installed and modeling_llama.apply_rotary_pos_emb is record.originals[0][1]


def test_unpatch_moves_the_original_modules_to_the_model_device():
    model = tiny_model("llama")
    original = model.model.rotary_emb
    rope.hf.patch(model)
    model.to("meta")
    rope.hf.unpatch(model)
    assert model.model.rotary_emb is original and original.inv_freq.device.type == "meta"


def test_the_layer_type_module_is_chosen_and_keeps_transformers_contracts():
    """Gemma 3 (rope_parameters nested by layer type) gets a LayerTypeRotaryEmbedding, Llama a
    RotaryEmbedding; each forward takes the arguments of the transformers module it replaces."""
    for model_type, cls in (("gemma3_text", rope.hf.LayerTypeRotaryEmbedding), ("llama", rope.hf.RotaryEmbedding)):
        model = tiny_model(model_type)
        theirs = type(model.model.rotary_emb)
        assert isinstance(rope.hf.rotary_embedding(model.config), cls)
        rope.hf.patch(model)
        try:
            assert type(model.model.rotary_emb) is cls
            assert list(inspect.signature(cls.forward).parameters) == list(inspect.signature(theirs.forward).parameters)
        finally:
            rope.hf.unpatch(model)


def test_rotary_modules_under_other_names_and_in_lists_are_swapped_and_restored():
    """A rotary module under another attribute (LFM2-MoE's pos_emb), in a ModuleList (Granite
    SWA's rotary_embs) or beside rotary_emb (Molmo 2's rotary_emb_unscaled) is a slot: patch
    swaps each for rope's, which keeps its config; unpatch puts each original back; rope's own
    per-layer-type parts are never slots."""
    import copy

    slots_of, slot_holder = sys.modules["rope.hf.install"].rotary_slots, sys.modules["rope.hf.install"].slot_holder
    model = tiny_model("llama")
    inner = model.model
    inner.pos_emb = copy.deepcopy(inner.rotary_emb)
    inner.rotary_embs = torch.nn.ModuleList([copy.deepcopy(inner.rotary_emb), copy.deepcopy(inner.rotary_emb)])
    originals = {name: module for name, module in model.named_modules() if "rotary" in name or "pos_emb" in name}
    slots = [f"{owner}.{attribute}" for owner, attribute, _ in slots_of(model)]
    assert slots == ["model.rotary_emb", "model.pos_emb", "model.rotary_embs.0", "model.rotary_embs.1"]
    assert slot_holder(model, "model.rotary_embs") is inner
    record = rope.hf.patch(model)
    try:
        assert sorted(r.name for r in record.rotary_modules) == sorted(slots)
        for name in slots:
            new = model.get_submodule(name)
            assert isinstance(new, rope.hf.RotaryEmbedding) and new.config is originals[name].config
    finally:
        rope.hf.unpatch(model)
    assert all(model.get_submodule(name) is module for name, module in originals.items())
    gemma = tiny_model("gemma3_text")
    rope.hf.install(gemma)
    assert [(o, a) for o, a, _ in slots_of(gemma)] == [("model", "rotary_emb")]


def test_a_composite_patches_each_modeling_module_with_its_own_convention(monkeypatch):
    """PE Audio's own module (its audio encoder) follows GLM's convention, its ModernBERT text
    model's module Llama's: patch sets each module's own functions, a second model that needs
    another convention in a module patched for the first is refused, changing nothing, and the
    last unpatch restores every original function."""
    from transformers.models.modernbert import modeling_modernbert
    from transformers.models.pe_audio import modeling_pe_audio

    from rope.hf import patching
    from rope.hf.coverage import tiny_model as build

    model, text = build("pe_audio"), build("modernbert")
    modules = (modeling_pe_audio, modeling_modernbert)
    originals = {module: module.apply_rotary_pos_emb for module in modules}
    record = rope.hf.patch(model)
    try:
        assert record.convention is rope.hf.FAMILIES["pe_audio"]
        assert [(module, held) for module, held, _ in record.modules] == [
            (modeling_pe_audio, rope.hf.FAMILIES["pe_audio"]), (modeling_modernbert, rope.hf.FAMILIES["modernbert"])]
        assert rope.hf.FAMILIES["pe_audio"] is not rope.hf.FAMILIES["modernbert"]
        assert all(module.apply_rotary_pos_emb is dict(held.functions)["apply_rotary_pos_emb"]
                   for module, held, _ in record.modules)
        assert all(dict(functions) == {"apply_rotary_pos_emb": originals[module]}
                   for module, _, functions in record.modules)
        other = dict(patching.FAMILIES, modernbert=rope.hf.FAMILIES["pe_audio"])
        monkeypatch.setattr(patching, "FAMILIES", other)  # as if ModernBERT followed GLM's convention
        before = dict(text.named_modules())
        with pytest.raises(ValueError, match="modeling_modernbert is patched with the llama convention for another "
                                             "model, not glm"):
            rope.hf.patch(text)
        assert all(module is before[name] for name, module in text.named_modules())
        monkeypatch.undo()
        second = rope.hf.patch(text)  # the same convention: shares the module
        assert second.modules[0][2] == record.modules[1][2]
        rope.hf.unpatch(text)
        assert modeling_modernbert.apply_rotary_pos_emb is rope.hf.apply_rotary_pos_emb  # pe_audio still patched
    finally:
        rope.hf.unpatch(model)
    assert all(module.apply_rotary_pos_emb is original for module, original in originals.items())


def test_a_module_that_would_need_two_conventions_is_refused():
    """Two parts of one model held in one modeling module under model types of different
    conventions: patch cannot set both, and refuses, changing nothing."""
    import copy

    from transformers.models.csm import modeling_csm
    from transformers.models.mimi import modeling_mimi

    from rope.hf.coverage import tiny_model as build

    model = build("csm")
    decoder = model.codec_model.decoder.decoder_transformer
    decoder.config = copy.copy(decoder.config)
    decoder.config.model_type = "glm"
    before = dict(model.named_modules()), modeling_csm.apply_rotary_pos_emb, modeling_mimi.apply_rotary_pos_emb
    with pytest.raises(ValueError, match="modeling_mimi holds rotary modules of this CsmForConditionalGeneration under "
                                         "two conventions, glm and llama"):
        rope.hf.patch(model)
    assert (modeling_csm.apply_rotary_pos_emb, modeling_mimi.apply_rotary_pos_emb) == before[1:]
    assert all(module is before[0][name] for name, module in model.named_modules())


def test_a_model_holding_parts_of_two_modeling_modules_patches_both():
    """CSM holds Mimi's codec, whose rotary modules are Mimi's classes: patch replaces the
    function in both modeling modules (its own first), and unpatch restores both; a function
    replaced since in either makes unpatch refuse, changing nothing."""
    from transformers.models.csm import modeling_csm
    from transformers.models.mimi import modeling_mimi

    from rope.hf.coverage import tiny_model as build

    model = build("csm")
    originals = {module: module.apply_rotary_pos_emb for module in (modeling_csm, modeling_mimi)}
    record = rope.hf.patch(model)
    try:
        assert [(module, held) for module, held, _ in record.modules] == [(modeling_csm, rope.hf.FAMILIES["csm"]),
                                                                           (modeling_mimi, rope.hf.FAMILIES["mimi"])]
        assert all(module.apply_rotary_pos_emb is rope.hf.apply_rotary_pos_emb for module in originals)
        assert all(dict(functions)["apply_rotary_pos_emb"] is originals[module]
                   for module, _, functions in record.modules)
        modeling_mimi.apply_rotary_pos_emb = originals[modeling_mimi]
        with pytest.raises(ValueError, match="modeling_mimi.apply_rotary_pos_emb is no longer rope's function"):
            rope.hf.unpatch(model)
        assert modeling_csm.apply_rotary_pos_emb is rope.hf.apply_rotary_pos_emb
        modeling_mimi.apply_rotary_pos_emb = rope.hf.apply_rotary_pos_emb
    finally:
        rope.hf.unpatch(model)
    assert all(module.apply_rotary_pos_emb is original for module, original in originals.items())


@pytest.mark.parametrize("model_type, style", [("qwen3_omni_moe_text", "interleaved"),
                                               ("ernie4_5_vl_moe_text", "alternating"),
                                               ("cohere_compass_text", "interleaved")])
def test_the_mrope_style_of_the_modeling_code_is_found(model_type, style):
    """The config names M-RoPE sections but no style (the modeling code fixes it): install tries
    the module's sections in each style and keeps the one that reproduces its tables."""
    from rope.hf.coverage import tiny_model as build

    model = build(model_type)
    rope.hf.install(model)
    styles = {m.rope_config.mrope_style for m in model.modules()
              if isinstance(m, rope.hf.RotaryEmbedding) and m.mrope_axes is not None}
    assert styles == {style}


# ----- probing leaves a stateful rotary module as it was -----------------------------------------


def dynamic_llama(*, seen: int = 40):
    """A tiny Llama with dynamic NTK scaling (max_position_embeddings 16) that has run ``seen``
    tokens: transformers' module keeps the base grown for that length while the length stays at
    16 or above, so its later logits depend on that state."""
    config = tiny_config("llama")
    config.max_position_embeddings = 16
    config.rope_parameters = {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 4.0}
    torch.manual_seed(5)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    if seen:
        logits(model, sample_tokens(2, (1, seen)))
    return model


def refused_patch(model):
    model.config.model_type = "cohere"  # refused after the probe: cohere reads interleaved tables
    with pytest.raises(ValueError, match="reads interleaved tables"):
        rope.hf.patch(model)


PROBING_PATHS = {
    "rotary_replacements": rope.hf.rotary_replacements,
    "patch and unpatch": lambda model: (rope.hf.patch(model), rope.hf.unpatch(model)),
    "refused patch": refused_patch,
}


@pytest.mark.parametrize("path", list(PROBING_PATHS))
def test_probing_leaves_a_stateful_rotary_module_as_it_was(path):
    """rotary_replacements ("the model untouched"), patch then unpatch ("restores exactly") and a
    refused patch ("changing nothing") probe a copy of the model's rotary module, never the module:
    transformers' dynamic module, grown on 40 tokens, gives the same logits at 30 tokens after
    as before, bit for bit (a module reset by a short call gives others)."""
    model = dynamic_llama()
    module = model.model.rotary_emb
    tokens = sample_tokens(3, (1, 30))
    buffers = {name: buffer.clone() for name, buffer in module.named_buffers()}
    attributes = {key: value for key, value in vars(module).items() if not key.startswith("_")}
    before = logits(model, tokens)
    assert not torch.allclose(logits(dynamic_llama(seen=0), tokens), before)  # the state matters here

    PROBING_PATHS[path](model)

    assert model.model.rotary_emb is module
    assert {name: buffer for name, buffer in module.named_buffers()}.keys() == buffers.keys()
    assert all(torch.equal(buffer, buffers[name]) for name, buffer in module.named_buffers())
    assert all(vars(module)[key] is value or vars(module)[key] == value for key, value in attributes.items())
    assert torch.equal(logits(model, tokens), before)


# ----- refusals: nothing changes ------------------------------------------------------------------


def llama_as(model_type):
    """A tiny Llama whose config claims another model_type."""
    model = tiny_model("llama")
    model.config.model_type = model_type
    return model


def doubled_llama():
    """A tiny Llama whose rotary module has frequencies its config does not give."""
    model = tiny_model("llama")

    class Doubled(type(model.model.rotary_emb)):
        def __init__(self, config):
            super().__init__(config)
            self.inv_freq = self.inv_freq * 2

    model.model.rotary_emb = Doubled(model.config)
    return model


def positionless_llama():
    """A tiny Llama with a second rotary module that takes no position ids (forward(x), as
    EfficientLoFTR's, which reads a feature map's height and width)."""
    model = tiny_model("llama")

    class PositionlessRotaryEmbedding(type(model.model.rotary_emb)):
        def forward(self, x):
            return super().forward(x, torch.arange(x.shape[-2])[None])

    model.model.grid_rotary = PositionlessRotaryEmbedding(model.config)
    return model


def two_axis_llama():
    """A tiny Llama whose rotary module reads two rows of position ids (their sum: NeoMME's row and
    column in a toy form)."""
    model = tiny_model("llama")

    class TwoAxisRotaryEmbedding(type(model.model.rotary_emb)):
        def forward(self, x, position_ids):
            return super().forward(x, position_ids.sum(0) if position_ids.dim() == 3 else position_ids)

    model.model.rotary_emb = TwoAxisRotaryEmbedding(model.config)
    return model


def absolute_esm():
    """A tiny ESM with its default absolute positions: no rotary module (ESM-2's checkpoints rotate)."""
    config = transformers.EsmConfig(vocab_size=33, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                    intermediate_size=32, pad_token_id=1)
    return transformers.EsmModel(config)


def no_config_module():
    return torch.nn.Linear(2, 2)


def numbered_model_type():
    model = torch.nn.Linear(2, 2)
    model.config = types.SimpleNamespace(model_type=3)
    return model


REFUSALS = [
    pytest.param(lambda: tiny_model("jamba"), ValueError,
                 r"model_type 'jamba' is not in rope.hf.FAMILIES \(refused: its attention does not rotate",
                 id="refused model_type"),
    pytest.param(doubled_llama, ValueError, r"patch: install: model.rotary_emb \(Doubled\) is not reproduced",
                 id="tables install refuses"),
    pytest.param(positionless_llama, ValueError,
                 r"model.grid_rotary \(PositionlessRotaryEmbedding\) is called as forward\(x\): it takes no position",
                 id="rotary module without position ids"),
    pytest.param(two_axis_llama, ValueError, r"model.rotary_emb \(TwoAxisRotaryEmbedding\) reads positions on 2 axes",
                 id="positions on two axes"),
    pytest.param(lambda: llama_as("llama4_text"), ValueError,
                 "modeling_llama has no function apply_rotary_emb, which the llama4 convention of model_type "
                 "'llama4_text'", id="modeling module without the function"),
    pytest.param(lambda: llama_as("cohere"), ValueError,
                 "model.rotary_emb returns rotate_half tables, but model_type 'cohere' reads interleaved tables",
                 id="tables of another form"),
    pytest.param(absolute_esm, ValueError,
                 r"EsmModel has no submodule named rotary_emb .* its config sets position_embedding_type='absolute': "
                 "the model does not rotate in this configuration", id="configuration that does not rotate"),
    pytest.param(no_config_module, ValueError, "patch: Linear has no config.model_type", id="no config"),
    pytest.param(numbered_model_type, TypeError, "model.config.model_type must be a str, got int",
                 id="model_type not a str"),
]


@pytest.mark.parametrize("build, error, message", REFUSALS)
def test_refusals_change_nothing(build, error, message):
    model = build()
    before = snapshot(model)
    with pytest.raises(error, match=message):
        rope.hf.patch(model)
    assert_unchanged(model, before)
    with pytest.raises(ValueError, match="is not patched"):
        rope.hf.unpatch(model)


@pytest.mark.parametrize("bad", ["model", None, 3, modeling_llama])
def test_bad_arguments_are_refused_by_name(bad):
    with pytest.raises(TypeError, match=f"model must be a torch.nn.Module, got {type(bad).__name__}"):
        rope.hf.patch(bad)
    with pytest.raises(TypeError, match=f"model must be a torch.nn.Module, got {type(bad).__name__}"):
        rope.hf.unpatch(bad)


def test_a_function_replaced_by_someone_else_is_not_overwritten():
    first, second = tiny_model("llama"), tiny_model("llama")
    original = modeling_llama.apply_rotary_pos_emb
    rope.hf.patch(first)

    def theirs(*args, **kwargs):
        return original(*args, **kwargs)

    modeling_llama.apply_rotary_pos_emb = theirs
    try:
        before = snapshot(second)
        with pytest.raises(ValueError, match="modeling_llama.apply_rotary_pos_emb is no longer rope's function"):
            rope.hf.patch(second)
        assert_unchanged(second, before)
        before = snapshot(first)
        with pytest.raises(ValueError, match="unpatch: .*apply_rotary_pos_emb is no longer rope's function"):
            rope.hf.unpatch(first)
        assert_unchanged(first, before)
    finally:
        modeling_llama.apply_rotary_pos_emb = rope.hf.apply_rotary_pos_emb
    rope.hf.unpatch(first)
    assert modeling_llama.apply_rotary_pos_emb is original


def test_unpatch_refuses_a_rotary_module_replaced_since():
    model = tiny_model("llama")
    rope.hf.patch(model)
    ours = model.model.rotary_emb
    model.model.rotary_emb = rope.hf.RotaryEmbedding(model.config)
    before = snapshot(model)
    with pytest.raises(ValueError, match=r"unpatch: \['model.rotary_emb'\] are no longer the rotary modules"):
        rope.hf.unpatch(model)
    assert_unchanged(model, before)
    model.model.rotary_emb = ours
    rope.hf.unpatch(model)


def test_a_failure_halfway_undoes_the_earlier_steps():
    """Two decoders in one model, the second refusing its new rotary module: the first swap and
    the modeling module's function are undone, and the error is the one raised."""
    model = torch.nn.Module()
    model.first, model.second = tiny_model("llama"), tiny_model("llama")
    model.config = model.first.config

    def refuse(self, name, value):
        if name == "rotary_emb" and isinstance(value, rope.hf.RotaryEmbedding):
            raise RuntimeError("this decoder keeps its rotary module")
        torch.nn.Module.__setattr__(self, name, value)

    decoder = type(model.second.model)
    model.second.model.__class__ = type("Stubborn", (decoder,), {"__module__": decoder.__module__,
                                                                 "__setattr__": refuse})
    before = snapshot(model)
    with pytest.raises(RuntimeError, match="keeps its rotary module"):
        rope.hf.patch(model)
    assert_unchanged(model, before)
    model.second.model.__class__ = decoder  # the bookkeeping holds nothing of the failed patch
    rope.hf.patch(model)
    rope.hf.unpatch(model)
    assert_unchanged(model, before)


# ----- position tables (GPT-J, CodeGen) -----------------------------------------------------------


def test_position_tables_hold_rope_exact_rows_and_come_back_cast_as_the_model():
    """GPT-J keeps its table in each attention's embed_positions buffer: patch puts rope's there
    (row m: the sin, then the cos, of m theta_i, rounded once from float64), which a second
    install leaves; cast while patched, unpatch gives back transformers' table cast as the model
    was; a table replaced since is refused by name."""
    model = tiny_model("gptj")
    attention = model.transformer.h[0].attn
    original = attention.embed_positions
    record = rope.hf.patch(model)
    try:
        assert [r.name for r in record.rotary_modules] == [f"transformer.h.{i}.attn.embed_positions" for i in (0, 1)]
        rows, width = original.shape
        theta = torch.tensor([1e4 ** (-2 * i / width) for i in range(width // 2)], dtype=torch.float64).float()
        angles = torch.arange(rows, dtype=torch.float64)[:, None] * theta.double()  # exact: 6 + 24 bits
        expected = torch.cat((torch.sin(angles), torch.cos(angles)), dim=-1).float()
        assert torch.equal(attention.embed_positions, expected) and not torch.equal(original, expected)
        assert rope.hf.install(model) == 0
        model.to(torch.bfloat16)
    finally:
        rope.hf.unpatch(model)
    assert torch.equal(attention.embed_positions, original.to(torch.bfloat16))
    with pytest.raises(ValueError, match=r"embed_positions holds bfloat16 numbers only \(stored in float32\): the "
                                         r"model was cast to bfloat16 and back"):
        rope.hf.patch(model.float())
    model = tiny_model("gptj")
    attention = model.transformer.h[0].attn
    rope.hf.patch(model)
    ours = attention.embed_positions
    attention.embed_positions = ours * 1.5
    with pytest.raises(ValueError, match=r"unpatch: \['transformer.h.0.attn.embed_positions'\] are no longer"):
        rope.hf.unpatch(model)
    attention.embed_positions = ours
    rope.hf.unpatch(model)


def test_install_refuses_a_position_table_it_does_not_reproduce():
    model = tiny_model("codegen")
    attention, other = model.transformer.h[0].attn, model.transformer.h[1].attn.embed_positions
    attention.embed_positions = attention.embed_positions * 2
    with pytest.raises(ValueError, match=r"transformer.h.0.attn.embed_positions \(64 rows of sin and cos halves\) is "
                                         r"not reproduced by rope's table of default RoPE of theta 10000 on 4 pairs"):
        rope.hf.install(model)
    assert model.transformer.h[1].attn.embed_positions is other  # nothing replaced


def test_the_family_table_is_read_only_and_checked():
    with pytest.raises(TypeError):
        rope.hf.FAMILIES["llama"] = rope.hf.FAMILIES["cohere"]
    with pytest.raises(ValueError, match="tables must be one of"):
        rope.hf.Convention("mine", (("apply_rotary_pos_emb", rope.hf.apply_rotary_pos_emb),), "halves")
