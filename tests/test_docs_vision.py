"""docs/vision.md's example runs as written: only the checkpoint directory is replaced by a tiny Gemma 3 checkpoint
written with transformers, whose image settings are the releases' (896 x 896 images, 14-pixel patches, 256 image
tokens, image token 262144), so the transform's defaults apply unchanged."""

import functools
import re
import tempfile
from pathlib import Path

import pytest
import torch

from tests.tune.data._tiny_tokenizers import corpus

transformers = pytest.importorskip("transformers")

DOC = Path(__file__).resolve().parents[1] / "docs" / "vision.md"


@functools.cache
def _tiny_gemma3_checkpoint() -> Path:
    import sentencepiece as spm

    out = Path(tempfile.mkdtemp(prefix="tune-docs-vision-"))
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus()), model_prefix=str(out / "tokenizer"), vocab_size=480, model_type="bpe",
        byte_fallback=True, add_dummy_prefix=False, remove_extra_whitespaces=False,
        normalization_rule_name="identity", split_digits=True, character_coverage=1.0,
        user_defined_symbols=["<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>"],
        minloglevel=2, num_threads=1, pad_id=0, eos_id=1, bos_id=2, unk_id=3, bos_piece="<bos>", eos_piece="<eos>",
        pad_piece="<pad>",
    )  # fmt: skip
    processor = spm.SentencePieceProcessor(model_file=str(out / "tokenizer.model"))
    config = transformers.Gemma3Config(
        text_config=dict(
            vocab_size=512, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=512, sliding_window=16,
            sliding_window_pattern=2, query_pre_attn_scalar=8,
        ),
        vision_config=dict(
            hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=2, image_size=896,
            patch_size=14, vision_use_head=False,
        ),
        mm_tokens_per_image=256, image_token_index=262_144, boi_token_index=processor.piece_to_id("<start_of_image>"),
        eoi_token_index=processor.piece_to_id("<end_of_image>"),
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.Gemma3ForConditionalGeneration(config).save_pretrained(out, safe_serialization=True)
    return out


def _example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)
    (example,) = [block for block in blocks if "from_hf(" in block]
    return example


def test_the_logits_example_runs_as_written(capsys):
    example = _example()
    assert 'checkpoint = "/tmp/gemma-3-4b-it"' in example
    example = example.replace("/tmp/gemma-3-4b-it", str(_tiny_gemma3_checkpoint()))
    namespace: dict = {}
    exec(compile(example, str(DOC), "exec"), namespace)
    logits, batch = namespace["logits"], namespace["batch"]
    assert logits.shape == (1, batch["tokens"].shape[1], 512)
    assert (batch["tokens"] == 262_144).sum() == 256  # one image's tokens, at the release's count
    assert torch.isfinite(logits).all()
    assert capsys.readouterr().out.strip() == str(logits.shape)
