"""Weights a family has no module for survive fine-tuning (``ModelFamily.passthrough_hf_keys``): a tiny
multimodal Gemma 3 (``Gemma3ForConditionalGeneration``) read by FullModelHFCheckpointer, its language model changed
as training would, written back: transformers loads the whole model, the vision tower and projector are the
input's bit for bit, and image+text logits equal those of the input model given the same language weights.
"""

import json
import os
import warnings

import pytest
import torch
import torch.multiprocessing as mp
from safetensors import safe_open
from safetensors.torch import save_file

from tests.tune.models.test_gemma3 import _multimodal_model
from tune.models.gemma3 import gemma3_from_hf_config
from tune.registry import ModelFamily, get_model_family
from tune.training.checkpointing import (
    ADAPTER_CONFIG,
    ADAPTER_KEY,
    MODEL_KEY,
    CheckpointError,
    FullModelHFCheckpointer,
    load_weights_file,
)

transformers = pytest.importorskip("transformers")

VISION = ("vision_tower.", "multi_modal_projector.")
# (tune key, transformers module-tree name) of the language weights the "training" below changes
CHANGED = [
    ("tok_embeddings.weight", "model.language_model.embed_tokens.weight"),
    ("layers.0.mlp.w1.weight", "model.language_model.layers.0.mlp.gate_proj.weight"),
    ("layers.5.attn.q_proj.weight", "model.language_model.layers.5.self_attn.q_proj.weight"),
]
# bos, begin-of-image, the 4 image tokens (mm_tokens_per_image), end-of-image, text
IMAGE_PROMPT = torch.tensor([[2, 97, 99, 99, 99, 99, 98, 10, 31, 57, 44, 23, 80]])
TEXT_PROMPT = torch.randint(3, 97, (2, 11), generator=torch.Generator().manual_seed(1))


def _hf_checkpoint(directory):
    """The tiny multimodal model saved as the hub's files, with a vision tower and projector that change logits."""
    model = _multimodal_model()
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():  # the projector starts at zero: give every non-language weight random values
        for name, param in model.named_parameters():
            if "language_model" not in name:
                param.copy_(0.3 * torch.randn(param.shape, generator=generator))
    model.save_pretrained(directory)
    return directory


def _deltas():
    generator = torch.Generator().manual_seed(3)
    return [0.05 * torch.randn(shape, generator=generator) for shape in ((101, 60), (94, 60), (56, 60))]


def _train(state):
    """A training-like change of the language model's weights, in tune's keys (in place)."""
    for (key, _), delta in zip(CHANGED, _deltas()):
        state[key] = state[key] + delta
    return state


def _expected_model(hf_dir):
    """The input model with the same change applied in transformers' names: what the output must compute."""
    model = transformers.Gemma3ForConditionalGeneration.from_pretrained(hf_dir).eval()
    params = dict(model.named_parameters())
    with torch.no_grad():
        for (_, name), delta in zip(CHANGED, _deltas()):
            params[name].add_(delta)
    return model


def _image_logits(model):
    pixels = torch.rand(1, 3, 16, 16, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        return model(input_ids=IMAGE_PROMPT, pixel_values=pixels, token_type_ids=(IMAGE_PROMPT == 99).long()).logits


def _tensors(directory, predicate=lambda key: True):
    out = {}
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            out.update({key: handle.get_tensor(key) for key in handle.keys() if predicate(key)})
    return out


def _is_vision(key):
    return key.startswith(VISION)


def _load_output(directory):
    model, info = transformers.Gemma3ForConditionalGeneration.from_pretrained(directory, output_loading_info=True)
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set(), info
    return model.eval()


def test_full_finetune_output_keeps_the_vision_tower(tmp_path):
    hf_dir = _hf_checkpoint(tmp_path / "hf")
    ckpt = FullModelHFCheckpointer(hf_dir, model_type="gemma3", output_dir=tmp_path / "out")
    state = ckpt.load_checkpoint()[MODEL_KEY]
    assert not any("vision" in key or "projector" in key for key in state)
    out = ckpt.save_checkpoint({MODEL_KEY: _train(state), "steps_run": 1}, step=1, intermediate_checkpoint=True)

    source = _tensors(hf_dir, _is_vision)
    written = _tensors(out, _is_vision)
    assert len(source) > 10 and source.keys() == written.keys()
    assert all(written[k].dtype == source[k].dtype and torch.equal(written[k], source[k]) for k in source)
    actual, expected = _image_logits(_load_output(out)), _image_logits(_expected_model(hf_dir))
    error = (actual - expected).abs().max().item()
    print(f"multimodal gemma3 written back: max abs image+text logit error {error:.3e}")
    assert error < 1e-5
    # the image changes the logits (the projector is not zero), so the comparison above exercises the vision tower
    blank = transformers.Gemma3ForConditionalGeneration.from_pretrained(out).eval()
    with torch.no_grad():
        blank.model.multi_modal_projector.mm_input_projection_weight.zero_()
    assert (_image_logits(blank) - actual).abs().max() > 1e-2

    # resuming reads the language model from step_1 (which now holds the vision tower too) and writes it again
    resumed = FullModelHFCheckpointer(
        hf_dir, model_type="gemma3", output_dir=tmp_path / "out", resume_from_checkpoint=True
    )
    state = resumed.load_checkpoint()[MODEL_KEY]
    again = resumed.save_checkpoint({MODEL_KEY: state}, step=2)
    assert all(torch.equal(tensor, source[key]) for key, tensor in _tensors(again, _is_vision).items())
    assert _tensors(again, _is_vision).keys() == source.keys()
    assert torch.equal(_image_logits(_load_output(again)), actual)


@pytest.mark.parametrize("suffix", [".safetensors", ".bin"])
def test_sharded_input_keeps_its_layout_and_dtypes(tmp_path, suffix):
    """Two files + index, the vision tower in bf16 spread over both: each tensor goes back to its own file."""
    hf_dir = _hf_checkpoint(tmp_path / "hf")
    full = load_weights_file(hf_dir / "model.safetensors")
    (hf_dir / "model.safetensors").unlink()
    names = [f"model-0000{i}-of-00002{suffix}" for i in (1, 2)]
    shards = ({}, {})
    for key, tensor in full.items():
        first = key.startswith("vision_tower.") or any(f"layers.{i}." in key for i in range(3))
        shards[0 if first else 1][key] = tensor.to(torch.bfloat16) if _is_vision(key) else tensor.clone()
    for name, shard in zip(names, shards):
        if suffix == ".bin":
            torch.save(shard, hf_dir / name)
        else:
            save_file(shard, str(hf_dir / name), metadata={"format": "pt"})
    index_name = "model.safetensors.index.json" if suffix == ".safetensors" else "pytorch_model.bin.index.json"
    weight_map = {key: names[i] for i, shard in enumerate(shards) for key in shard}
    (hf_dir / index_name).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))

    ckpt = FullModelHFCheckpointer(hf_dir, model_type="gemma3", output_dir=tmp_path / "out")
    out = ckpt.save_checkpoint({MODEL_KEY: _train(ckpt.load_checkpoint()[MODEL_KEY])}, step=1)

    out_names = [f"model-0000{i}-of-00002.safetensors" for i in (1, 2)]  # .bin inputs are written as safetensors
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == {key: out_names[names.index(file)] for key, file in weight_map.items()}
    for name, shard in zip(out_names, shards):
        written = _tensors(out, lambda key, name=name: index["weight_map"][key] == name)
        assert written.keys() == shard.keys()
        for key in filter(_is_vision, shard):
            assert written[key].dtype == torch.bfloat16 and torch.equal(written[key], shard[key])
    assert index["metadata"]["total_size"] == sum(os.path.getsize(out / name) for name in out_names) - sum(
        _header_size(out / name) for name in out_names
    )
    _load_output(out)


def _header_size(path):
    # a safetensors file: 8 bytes giving the JSON header's length, the header, then the tensor data
    with open(path, "rb") as handle:
        return 8 + int.from_bytes(handle.read(8), "little")


def test_lora_adapter_on_a_multimodal_base_loads_in_peft(tmp_path):
    import peft

    hf_dir = _hf_checkpoint(tmp_path / "hf")
    ckpt = FullModelHFCheckpointer(hf_dir, model_type="gemma3", output_dir=tmp_path / "out")
    config = json.loads((hf_dir / "config.json").read_text())
    model = gemma3_from_hf_config(config, lora_attn_modules=["q_proj", "v_proj"], lora_rank=4, lora_alpha=8.0)
    missing, unexpected = model.load_state_dict(ckpt.load_checkpoint()[MODEL_KEY], strict=False)
    assert not unexpected and missing and all("lora_" in key for key in missing)
    generator = torch.Generator().manual_seed(4)
    with torch.no_grad():  # "training" moved the adapters away from their (output-preserving) initialisation
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.add_(0.1 * torch.randn(param.shape, generator=generator))
    out = ckpt.save_checkpoint({MODEL_KEY: model.state_dict(), ADAPTER_CONFIG: {"r": 4, "lora_alpha": 8.0}}, step=1)

    adapter_config = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert adapter_config["target_modules"] == ["q_proj", "v_proj"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        base = transformers.Gemma3ForConditionalGeneration.from_pretrained(hf_dir)
        peft_model = peft.PeftModel.from_pretrained(base, out / "adapter").eval()
    assert not [str(w.message) for w in caught if "adapter keys" in str(w.message)]
    lora_names = [name for name, _ in peft_model.named_parameters() if "lora_" in name]
    assert len(lora_names) == 7 * 2 * 2 and not any("vision_tower" in name for name in lora_names)
    merged = _load_output(out)
    with torch.no_grad():
        ours = model.eval()(TEXT_PROMPT)
        theirs, merged_logits = peft_model(input_ids=TEXT_PROMPT).logits, merged(input_ids=TEXT_PROMPT).logits
    peft_error, merged_error = (theirs - ours).abs().max().item(), (merged_logits - theirs).abs().max().item()
    print(f"gemma3 multimodal LoRA: PEFT vs tune {peft_error:.3e}, merged vs PEFT {merged_error:.3e} (text logits)")
    assert ours.abs().max() > 1.0 and peft_error < 1e-5 and merged_error < 1e-5
    image_error = (_image_logits(merged) - _image_logits(peft_model)).abs().max().item()
    print(f"gemma3 multimodal LoRA: merged vs PEFT image+text logits {image_error:.3e}")
    assert image_error < 1e-5
    # and tune reads the adapter back (a resumed LoRA run, or adapter_checkpoint)
    reread = FullModelHFCheckpointer(hf_dir, model_type="gemma3", output_dir=tmp_path / "o2", adapter_checkpoint=out)
    adapter = reread.load_checkpoint()[ADAPTER_KEY]
    trained = {key: value for key, value in model.state_dict().items() if "lora_" in key}
    assert adapter.keys() == trained.keys() and all(torch.equal(adapter[k], trained[k]) for k in trained)


def _distributed_worker(rank: int, store: str, hf_dir: str, output_dir: str) -> None:
    """What full_finetune_distributed does around a save: every rank reads the checkpoint and holds a shard, the
    full state is gathered to rank 0, which alone writes."""
    from tune import training

    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    ckpt = FullModelHFCheckpointer(hf_dir, model_type="gemma3", output_dir=output_dir)
    model = gemma3_from_hf_config(json.loads(open(f"{hf_dir}/config.json").read()))
    model.load_state_dict(_train(ckpt.load_checkpoint()[MODEL_KEY]))
    training.shard_model(model, training.family_shard_conditions(model, "gemma3"))
    full_state = training.gather_cpu_state_dict(model)
    with training.errors_on_all_ranks():
        if rank == 0:
            ckpt.save_checkpoint({MODEL_KEY: full_state}, step=1)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_distributed_save_on_rank_zero_keeps_the_vision_tower(tmp_path):
    hf_dir = _hf_checkpoint(tmp_path / "hf")
    args = (str(tmp_path / "store"), str(hf_dir), str(tmp_path / "out"))
    mp.start_processes(_distributed_worker, args=args, nprocs=2, start_method="spawn")
    out = tmp_path / "out" / "step_1"
    source, written = _tensors(hf_dir, _is_vision), _tensors(out, _is_vision)
    assert source.keys() == written.keys() and all(torch.equal(written[k], source[k]) for k in source)
    error = (_image_logits(_load_output(out)) - _image_logits(_expected_model(hf_dir))).abs().max().item()
    print(f"multimodal gemma3 written back by a 2-rank run: max abs image+text logit error {error:.3e}")
    assert error < 1e-5


def test_an_input_file_changed_during_the_run_is_named(tmp_path):
    hf_dir = _hf_checkpoint(tmp_path / "hf")
    ckpt = FullModelHFCheckpointer(hf_dir, model_type="gemma3", output_dir=tmp_path / "out")
    state = {key: value.clone() for key, value in ckpt.load_checkpoint()[MODEL_KEY].items()}
    language = {k: v.clone() for k, v in load_weights_file(hf_dir / "model.safetensors").items() if not _is_vision(k)}
    save_file(language, str(tmp_path / "replacement"), metadata={"format": "pt"})
    os.replace(tmp_path / "replacement", hf_dir / "model.safetensors")  # a new file: memory maps keep the old one
    with pytest.raises(CheckpointError, match=r"model\.safetensors no longer holds .*vision_tower"):
        ckpt.save_checkpoint({MODEL_KEY: state}, step=1)
    assert not (tmp_path / "out" / "step_1").exists()  # the failed save left nothing behind


def test_a_bad_passthrough_expression_is_named(tmp_path):
    hf_dir = _hf_checkpoint(tmp_path / "hf")
    gemma3 = get_model_family("gemma3")
    broken = ModelFamily(
        name="gemma3_broken_passthrough", hf_to_tune=gemma3.hf_to_tune, passthrough_hf_keys="(vision_tower"
    )
    from tune.registry import register_model_family

    register_model_family(broken)
    try:
        with pytest.raises(ValueError, match=r"gemma3_broken_passthrough.*passthrough_hf_keys='\(vision_tower'"):
            FullModelHFCheckpointer(hf_dir, model_type=broken.name, output_dir=tmp_path / "out")
    finally:
        from tune import registry

        registry._FAMILIES.pop(broken.name, None)
