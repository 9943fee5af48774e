"""Feeds of model types whose own forward the probe cannot run from its signature, by the part
of them that rotates (:data:`rope.hf.coverage.PART_FEEDS`, tried before
:func:`rope.hf.feeds.candidates`).

Qwen2.5-Omni's token-to-wave model is probed by its DiT (:func:`token_to_wave`).

SAM 2 Video's and SAM 3 Tracker Video's forward takes an inference session (frames, prompts and
the memory of earlier frames, which a processor builds); the only part of them that rotates by
their ``apply_rotary_pos_emb_2d`` is the memory attention, which a tracked frame's features run
through against the memory of earlier frames. Its probe feeds it directly
(:func:`memory_attention`): one frame's features on the grid of its rotary module (the tiny
config's ``memory_attention_rope_feat_sizes``, :data:`rope.hf.feeds.GRID`'s rows and columns by
:func:`memory_grid`), as ``[positions, batch, width]``, and two earlier frames' memory with its
position embeddings (``repeat_freqs_k``: each memory frame turned by the frame's tables). No
object pointers are fed: they pass unrotated (``num_k_exclude_rope``), so queries moved by 2^16
would move away from them and the shift test would see absolute positions; rope's function on
them is checked against transformers' in ``tests/test_hf_part_feeds.py``.

EdgeTAM Video's forward takes an inference session too. Its memory attention turns the queries
by their grid's tables (``apply_rotary_pos_emb_2d_self_attn``, and the queries of
``apply_rotary_pos_emb_2d_cross_attn``), and of the memory only the spatial keys, by a grid of
their own (``memory_attention_rope_k_sizes``: the perceiver's 2-D latents, a square of windows);
the 1-D latents that open each memory frame (temporal keys) and the object pointers after the
frames pass unrotated. Its probe (:func:`edgetam_memory_attention`) feeds the frames' spatial
keys alone (:func:`edgetam_grids` sets no 1-D latents and a 3 x 3 key grid): unrotated keys, as
SAM 2's object pointers, would let the shift test see absolute positions. The memory attention
counts the frames by ``num_spatial_memory_tokens`` (the model passes the length of its list of
frames), fed as :data:`MEMORY_FRAMES` (a ``num_`` argument of shape ``(n,)`` is the count n,
:class:`rope.hf.feeds.Feed`); latents and object pointers are checked against transformers in
``tests/test_hf_part_feeds.py``.

EsmFold2's forward folds a featurized complex (token, residue and chain indices, residue types,
token bonds, an ``EsmFold2AtomInputs`` of reference-conformer atoms), which no name and shape
tell: its probe runs the trunk's input embedder (:func:`folded_complex`), the smallest part whose
forward calls the atom encoder's rotary module (``embed_atoms``: cos and sin of the atoms'
coordinates and space ids) and its atom attention, with a complex that :func:`complex_inputs`
builds (:attr:`rope.hf.feeds.Feed.build`): one chain of :data:`COMPLEX_TOKENS` residues of
:data:`ATOMS_PER_TOKEN` atoms each, every atom's space id its token's index, as EsmFold2's
featurizer numbers them. The probe's shift moves the space ids (the rotary module's integer
positions) and not the coordinates: the atoms' relative positions stay.
"""

from __future__ import annotations

import torch
from torch import nn

from .feeds import BATCH, GRID, LENGTH, Feed, builder

MEMORY_FRAMES = 2
"""Earlier frames in the memory a tracked frame attends to (SAM 2 keeps up to 7)."""


def memory_grid(config) -> None:
    """Give the memory attention's rotary grid :data:`rope.hf.feeds.GRID`'s rows and columns
    (``memory_attention_rope_feat_sizes`` is width, height: 64 x 64 by default, 4096 positions,
    too many for a probe on CPUs; not square, so swapped axes show), and its weights the spread
    :data:`MEMORY_INITIALIZER_RANGE`."""
    config.memory_attention_rope_feat_sizes = [GRID[2], GRID[1]]
    config.initializer_range = MEMORY_INITIALIZER_RANGE


MEMORY_INITIALIZER_RANGE = 0.07
"""The tiny video trackers' weights' standard deviation. At :data:`rope.hf.coverage.TINY`'s 0.2,
the memory attention's one head of 256 has attention logits so large that its float32 output is
1e-4 away from its float64 one (transformers' own, and rope's alike): past the probe's tolerance.
At 0.07 both are within 2e-6 of float64, while transformers' float32 angles at 2^16 still move
the output by 8e-4 (at the default 0.02, by 3e-6: the shift test could not tell them apart)."""


def memory_attention(config) -> tuple[Feed, ...]:
    """The memory attention's feed: ``current_vision_features`` ``[rows * columns, batch,
    memory_attention_hidden_size]``, and ``memory`` with ``memory_posision_embeddings`` (sic)
    ``[frames * rows * columns, batch, memory_encoder_output_channels]``."""
    positions = config.memory_attention_rope_feat_sizes[0] * config.memory_attention_rope_feat_sizes[1]
    memory = (MEMORY_FRAMES * positions, BATCH, config.memory_encoder_output_channels)
    return (Feed("memory_attention", "current_vision_features", (positions, BATCH, config.memory_attention_hidden_size),
                 (("memory", memory), ("memory_posision_embeddings", memory))),)


EDGETAM_KEY_SIDE = 3
"""The side of EdgeTAM's tiny key grid (``memory_attention_rope_k_sizes``, 16 x 16 by default):
the perceiver's 2-D latents are a square of windows, so it is square."""


def edgetam_grids(config) -> None:
    """EdgeTAM Video's memory attention's query grid and spread as :func:`memory_grid`'s, its key
    grid :data:`EDGETAM_KEY_SIDE` a side, as many 2-D latents in its perceiver, and no 1-D
    latents (the keys that pass unrotated, 256 by default: see the module docstring). At
    :data:`MEMORY_INITIALIZER_RANGE` (two layers, one head of 256), rope's output near position 0
    is within 1.5e-6 of transformers' and moves by 2.5e-6 at 2^16, transformers' by 8e-4."""
    memory_grid(config)
    config.memory_attention_rope_k_sizes = [EDGETAM_KEY_SIDE, EDGETAM_KEY_SIDE]
    config.perceiver_resampler_num_latents_2d = EDGETAM_KEY_SIDE**2
    config.perceiver_resampler_num_latents = 0


def edgetam_memory_attention(config) -> tuple[Feed, ...]:
    """EdgeTAM Video's memory attention's feed: ``current_vision_features`` as
    :func:`memory_attention`'s, and ``memory`` with ``memory_posision_embeddings`` (sic)
    ``[frames * (latents + keys), batch, memory_encoder_output_channels]`` (each frame its 1-D
    latents, then its 2-D ones, a key on each position of ``memory_attention_rope_k_sizes``),
    ``num_spatial_memory_tokens`` the frames."""
    (feed,) = memory_attention(config)
    keys = config.memory_attention_rope_k_sizes[0] * config.memory_attention_rope_k_sizes[1]
    memory = (MEMORY_FRAMES * (config.perceiver_resampler_num_latents + keys), BATCH,
              config.memory_encoder_output_channels)
    return (Feed(feed.part, feed.argument, feed.shape, (("memory", memory), ("memory_posision_embeddings", memory),
                                                        ("num_spatial_memory_tokens", (MEMORY_FRAMES,)))),)


def token_to_wave(config) -> tuple[Feed, ...]:
    """Qwen2.5-Omni's token-to-wave model by its DiT (``code2wav_dit_model``), the part that
    rotates: one step of its diffusion, as its sampler calls it (noisy mel frames
    ``[batch, LENGTH, mel_dim]``, the reference mel spectrogram as ``condition_vector``, a speaker
    embedding per frame, codec codes of ``repeats`` frames each, a diffusion time per sample).
    Its own forward draws the diffusion's start with ``torch.randn`` and hands the mel
    spectrogram to a vocoder, whose tiny random waveform is 1e-8 to 1e-2 at most: no measure of
    the rotation."""
    dit = config.dit_config
    frames = (BATCH, LENGTH, dit.mel_dim)
    return (Feed("code2wav_dit_model", "hidden_states", frames,
                 (("condition_vector", frames), ("speaker_embedding", (BATCH, LENGTH, dit.enc_emb_dim)),
                  ("quantized_code", (BATCH, LENGTH // dit.repeats)), ("time_step", (BATCH,)))),)


COMPLEX_TOKENS, ATOMS_PER_TOKEN = LENGTH // 2, 2
"""The tokens (residues) of the complex EsmFold2's probe folds and each one's atoms: as many
atoms as :data:`rope.hf.feeds.LENGTH`, so that its atom attention's sliding window (8 atoms in
the tiny config) covers a few tokens."""


def folded_complex(config) -> tuple[Feed, ...]:
    """EsmFold2's feed: its input embedder (``input_embedder``), ``atom_inputs`` of
    ``[batch, atoms]`` atoms and ``num_tokens`` tokens, built by :func:`complex_inputs`. Its
    first output (:func:`rope.hf.feeds.first_output`), the largest, is ``single_inputs``: the
    atom encoder's output pooled per token, beside the residue types and profile."""
    return (Feed("input_embedder", "atom_inputs", (BATCH, COMPLEX_TOKENS * ATOMS_PER_TOKEN),
                 (("num_tokens", (COMPLEX_TOKENS,)),), build="complex_inputs"),)


@builder
def complex_inputs(module: nn.Module, feed: Feed, tokens: torch.Tensor) -> dict:
    """The arguments of EsmFold2's input embedder ``module`` for ``feed`` (:func:`folded_complex`),
    drawn from a generator seeded by ``tokens``, in the encoded forms its model hands it
    (``EsmFold2Model._prepare_features``: one-hot elements, atom-name characters and residue
    types): atoms at standard normal coordinates (angstroms) with charges in {-1, 0, 1}, each
    token's atoms in order, their space id and ``atom_to_token`` the token's index, every atom
    valid; one chain (asym, sym and entity id 0) of residues numbered 0, 1, ..., its profile its
    residue types (no MSA), no deletions, no token bonds."""
    from transformers.models.esmfold2.modeling_esmfold2 import EsmFold2AtomInputs

    config = module.atom_encoder.config
    (batch, atoms), ((_, (count,)),) = feed.shape, feed.extra
    generator = torch.Generator().manual_seed(int(tokens.sum()) * 7)

    def one_hot(classes: int, *shape: int) -> torch.Tensor:
        drawn = torch.randint(1, classes, shape, generator=generator)
        return torch.nn.functional.one_hot(drawn, classes).float()

    token_of_atom = (torch.arange(atoms) * count // atoms).expand(batch, atoms)
    atom_inputs = EsmFold2AtomInputs(
        ref_pos=torch.randn(batch, atoms, 3, generator=generator),
        ref_charge=torch.randint(-1, 2, (batch, atoms), generator=generator).float(),
        atom_attention_mask=torch.ones(batch, atoms, dtype=torch.bool),
        ref_element=one_hot(config.max_atomic_number, batch, atoms),
        ref_atom_name_chars=one_hot(config.char_vocab_size, batch, atoms, config.max_chars),
        ref_space_uid=token_of_atom, atom_to_token=token_of_atom)
    residues = one_hot(config.num_res_types, batch, count)
    index = torch.arange(count).expand(batch, count)
    chain = torch.zeros(batch, count, dtype=torch.long)
    return dict(atom_inputs=atom_inputs, res_type_one_hot=residues, profile=residues,
                deletion_mean=torch.zeros(batch, count), token_index=index, residue_index=index, asym_id=chain,
                sym_id=chain, entity_id=chain, token_bonds=torch.zeros(batch, count, count, 1), num_tokens=count)
