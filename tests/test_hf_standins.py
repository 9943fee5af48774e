"""rope.hf.standins: the timm towers of composite models, which timm (not installed here) builds.

* Gemma 3n's tiny model holds rope's stand-in for timm's MobileNetV5 (which does not rotate): no
  weights, a forward that refuses to run; transformers' auto classes are themselves again after
  the build; patched, its vision tower is left alone and its text model is rope's.
* PE Video and PE Audio-Video, whose frames' tower (timm's Eva PE ViT) rotates with timm's own
  code, are refused naming that tower; the text model the refusal points to is patched alone to
  transformers' output near position 0.
"""

import pytest
import torch

import rope

transformers = pytest.importorskip("transformers")
from rope.hf import coverage, coverage_table, standins  # noqa: E402
from rope.hf.feeds import Feed  # noqa: E402


def auto_methods():
    return [getattr(transformers, name).__dict__.get("from_config") for name in standins.AUTO_CLASSES]


def test_gemma3n_is_built_with_a_stand_in_that_runs_nothing():
    before = auto_methods()
    model = coverage.tiny_model("gemma3n")
    assert auto_methods() == before
    tower = model.model.vision_tower
    assert isinstance(tower, standins.TimmStandIn) and not list(tower.parameters())
    assert tower.config.architecture in standins.STILL_TOWERS
    with pytest.raises(RuntimeError, match="stand-in for timm's mobilenetv5_300m_enc runs nothing"):
        tower(pixel_values=torch.zeros(1, 3, 8, 8))


def test_the_auto_classes_are_restored_after_a_failed_build():
    before = auto_methods()
    with pytest.raises(ZeroDivisionError), standins.timm_standins():
        assert auto_methods() != before
        raise ZeroDivisionError
    assert auto_methods() == before


def test_gemma3n_patched_swaps_its_text_rotation_and_leaves_the_tower():
    model = coverage.tiny_model("gemma3n")
    tower = model.model.vision_tower
    record = rope.hf.patch(model)
    try:
        assert record.convention is rope.hf.FAMILIES["gemma3n"] is rope.hf.FAMILIES["gemma3n_text"]
        assert record.rotary_modules and type(model.model.language_model.rotary_emb).__module__.startswith("rope.")
        assert model.model.vision_tower is tower and not record.vision_modules
    finally:
        rope.hf.unpatch(model)


def test_timm_architectures_are_found_in_nested_configs():
    config = coverage.tiny_config("pe_audio_video")
    assert standins.timm_architectures(config) == {
        "audio_video_config.video_config.vision_config": "vit_pe_core_large_patch14_336"}
    assert standins.timm_architectures(coverage.tiny_config("gemma3n")) == {"vision_config": "mobilenetv5_300m_enc"}
    assert standins.rotating_tower(coverage.tiny_config("gemma3n")) is None


@pytest.mark.parametrize("model_type", ["pe_video", "pe_video_encoder", "pe_audio_video", "pe_audio_video_encoder"])
def test_a_rotating_timm_tower_is_refused_by_name(model_type):
    reason = coverage_table.REFUSED[model_type]
    assert reason == coverage._rotating_tower(model_type, coverage.tiny_config(model_type))
    assert "vit_pe_core_large_patch14_336" in reason and "rotary embedding" in reason


@pytest.mark.parametrize("model_type", ["pe_video", "pe_audio_video"])
def test_the_text_model_a_refusal_names_is_patched_alone(model_type):
    assert "rope.hf.patch(model.text_model)" in coverage_table.REFUSED[model_type]
    with standins.timm_standins(standins.ROTATING_TOWERS):
        model = coverage.tiny_model(model_type)
    with pytest.raises(ValueError, match="vit_pe_core_large_patch14_336"):
        rope.hf.patch(model)
    tokens = coverage.sample_tokens(seed=5)
    expected = coverage.output(model.text_model, tokens, feed=Feed())
    rope.hf.patch(model.text_model)
    try:
        torch.testing.assert_close(coverage.output(model.text_model, tokens, feed=Feed()), expected,
                                   **coverage.LOGITS_TOLERANCE)
    finally:
        rope.hf.unpatch(model.text_model)
    assert torch.equal(coverage.output(model.text_model, tokens, feed=Feed()), expected)
