import json

import pytest
import torch
from safetensors import safe_open

from tests.tune.training.checkpointing.tiny_llama import FAMILY, TinyLlama, make_hf_checkpoint, reference_model
from tune.training.checkpointing import MODEL_KEY, FullModelHFCheckpointer


def _perturbed_model(state_dict):
    # "Training": change every weight so the test can tell a saved model from the original.
    model = TinyLlama()
    model.load_state_dict(state_dict)
    torch.manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.01 * torch.randn_like(param))
    return model


_SAFETENSORS_NAMES = {torch.float32: "F32", torch.bfloat16: "BF16"}


def _layout(directory, index="model.safetensors.index.json"):
    return json.loads((directory / index).read_text())["weight_map"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_round_trip_keeps_layout_and_dtype_and_loads_in_transformers(tmp_path, dtype):
    source = tmp_path / "model"
    make_hf_checkpoint(source, dtype=dtype, max_shard_size="40KB" if dtype == torch.float32 else "20KB")
    assert len(set(_layout(source).values())) > 1
    ckpt = FullModelHFCheckpointer(source, model_type=FAMILY, output_dir=tmp_path / "out")
    state = ckpt.load_checkpoint()[MODEL_KEY]
    assert all(t.dtype == dtype for t in state.values())
    model = _perturbed_model({k: v.float() for k, v in state.items()})
    out = ckpt.save_checkpoint({MODEL_KEY: model.state_dict()}, epoch=1)
    assert out == tmp_path / "out" / "epoch_1"
    assert _layout(out) == _layout(source)  # same shard split and file names
    for name in set(_layout(source).values()):
        with safe_open(str(out / name), "pt") as handle:
            assert {handle.get_slice(k).get_dtype() for k in handle.keys()} == {_SAFETENSORS_NAMES[dtype]}
    for name in (
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    ):
        assert (out / name).read_bytes() == (source / name).read_bytes()
    # transformers reads the output; its logits equal ours with the same (saved-dtype) weights.
    tokens = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    model.load_state_dict({k: v.to(dtype).float() for k, v in model.state_dict().items()})
    with torch.no_grad():
        torch.testing.assert_close(reference_model(out)(tokens).logits, model(tokens), rtol=1e-5, atol=1e-5)


def test_checkpoint_files_as_list_dict_or_omitted_read_the_same(hf_dir, tmp_path):
    names = sorted(set(_layout(hf_dir).values()))
    forms = [names, {"filename_format": "model-{}-of-{}.safetensors", "max_filename": "00002"}, None]
    loaded = [
        FullModelHFCheckpointer(hf_dir, files, model_type=FAMILY, output_dir=tmp_path / "o").load_checkpoint()
        for files in forms
    ]
    for other in loaded[1:]:
        assert other[MODEL_KEY].keys() == loaded[0][MODEL_KEY].keys()
        for key, value in other[MODEL_KEY].items():
            assert torch.equal(value, loaded[0][MODEL_KEY][key])


def test_bin_input_is_read_weights_only_and_written_as_safetensors(tmp_path):
    source = tmp_path / "model"
    reference = make_hf_checkpoint(source, bin_format=True)
    assert (source / "pytorch_model.bin.index.json").is_file()
    ckpt = FullModelHFCheckpointer(source, model_type=FAMILY, output_dir=tmp_path / "out")
    state = ckpt.load_checkpoint()[MODEL_KEY]
    assert torch.equal(state["layers.1.attn.k_proj.weight"], reference.model.layers[1].self_attn.k_proj.weight)
    out = ckpt.save_checkpoint({MODEL_KEY: state}, step=3)
    files = sorted(set(_layout(out).values()))
    assert files == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    logits = reference_model(out)(torch.arange(8)[None]).logits
    torch.testing.assert_close(logits, reference(torch.arange(8)[None]).logits)


def test_single_file_stays_single_file(tmp_path):
    source = tmp_path / "model"
    make_hf_checkpoint(source, max_shard_size="10MB")
    ckpt = FullModelHFCheckpointer(source, model_type=FAMILY, output_dir=tmp_path / "out")
    out = ckpt.save_checkpoint(ckpt.load_checkpoint(), step=1)
    assert (out / "model.safetensors").is_file() and not (out / "model.safetensors.index.json").exists()


def test_missing_files_list_the_directory_and_the_download_command(hf_dir, tmp_path):
    (hf_dir / "tune_download.json").write_text(json.dumps({"repo_id": "org/tiny-llama", "revision": "main"}))
    with pytest.raises(ValueError) as error:
        FullModelHFCheckpointer(
            hf_dir, ["model-00001-of-00003.safetensors"], model_type=FAMILY, output_dir=tmp_path / "out"
        )
    message = str(error.value)
    assert "model-00001-of-00003.safetensors" in message
    assert "model-00002-of-00002.safetensors" in message and "config.json" in message  # what the dir holds
    assert f"tune download org/tiny-llama --output-dir {hf_dir}" in message


def test_empty_directory_says_how_to_download(tmp_path):
    (tmp_path / "model").mkdir()
    with pytest.raises(ValueError, match="tune download"):
        FullModelHFCheckpointer(tmp_path / "model", model_type=FAMILY, output_dir=tmp_path / "out")


def test_output_dir_inside_checkpoint_dir_is_refused(hf_dir):
    for output_dir in (hf_dir, hf_dir / "runs" / "a"):
        with pytest.raises(ValueError, match="inside checkpoint_dir"):
            FullModelHFCheckpointer(hf_dir, model_type=FAMILY, output_dir=output_dir)


def test_truncated_safetensors_is_named(hf_dir, tmp_path):
    shard = hf_dir / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])
    ckpt = FullModelHFCheckpointer(hf_dir, model_type=FAMILY, output_dir=tmp_path / "out")
    with pytest.raises(ValueError, match="model-00002-of-00002.safetensors.*corrupt or truncated"):
        ckpt.load_checkpoint()


def test_unknown_model_type_lists_families(hf_dir, tmp_path):
    with pytest.raises(ValueError, match="Unknown model_type 'no_such_family'.*" + FAMILY):
        FullModelHFCheckpointer(hf_dir, model_type="no_such_family", output_dir=tmp_path / "out")
