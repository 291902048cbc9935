"""tune/rlhf/_reward_model.py: a trained reward model as a GRPO reward function.

The reference is transformers' ``LlamaForSequenceClassification`` of the same checkpoint (built here, tiny and
random), which scores a sequence at its last token: RewardModelReward must give its scores.
"""

import io
import json
import random

import pytest
import torch

from tune.datasets import preference_dataset
from tune.models.llama2 import llama2_classifier, llama2_tokenizer
from tune.rlhf import RewardModelReward
from tune.training import FullModelHFCheckpointer

VOCAB_SIZE = 320  # byte fallback takes 259 pieces
DIMS = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
PAIRS = [
    ("red fig cat. How many items are in the list?", "three"),
    ("apple dog blue owl lime. How many items are in the list?", "five, I counted them twice"),
    ("fig owl. How many items are in the list?", ""),  # a policy may stop at once: scored, not refused
]


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """A SentencePiece tokenizer, a tiny random LlamaForSequenceClassification (reward/) and a LlamaForCausalLM of
    the same size (causal_lm/), both in the Hugging Face format."""
    import sentencepiece as spm
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

    root = tmp_path_factory.mktemp("reward_model_reward")
    rng = random.Random(0)
    words = "red fig cat apple dog blue owl lime how many items are in the list three five counted them twice".split()
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(" ".join(rng.choice(words) for _ in range(10)) for _ in range(300)),
        model_writer=model,
        vocab_size=VOCAB_SIZE,
        model_type="bpe",
        byte_fallback=True,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        minloglevel=2,
    )
    (root / "tokenizer.model").write_bytes(model.getvalue())
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE, max_position_embeddings=128, rms_norm_eps=1e-5, tie_word_embeddings=False, **DIMS
    )
    config.num_labels, config.pad_token_id = 1, 0
    torch.manual_seed(0)
    LlamaForSequenceClassification(config).save_pretrained(root / "reward")
    LlamaForCausalLM(config).save_pretrained(root / "causal_lm")
    return root


def _reward(assets, checkpoint: str, tmp_path) -> RewardModelReward:
    model = llama2_classifier(
        num_classes=1, vocab_size=VOCAB_SIZE, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=32, max_seq_len=128,
        intermediate_dim=64, norm_eps=1e-5,
    )  # fmt: skip
    checkpointer = FullModelHFCheckpointer(
        checkpoint_dir=assets / checkpoint,
        checkpoint_files=["model.safetensors"],
        model_type="REWARD",
        output_dir=tmp_path / "unused",
    )
    tokenizer = llama2_tokenizer(str(assets / "tokenizer.model"), prompt_template="tune.data.Llama2ChatFormat")
    return RewardModelReward(model, tokenizer, checkpointer, batch_size=2)


def test_scores_equal_transformers_sequence_classifier(assets, tmp_path):
    from transformers import LlamaForSequenceClassification

    reward = _reward(assets, "reward", tmp_path)
    prompts, completions = [p for p, _ in PAIRS], [c for _, c in PAIRS]
    scores = reward(prompts, completions, output=["three", "five", "two"])  # other columns are ignored

    reference = LlamaForSequenceClassification.from_pretrained(assets / "reward", dtype=torch.float32).eval()
    sequences = [reward.tokenize(p, c) for p, c in PAIRS]
    assert len(sequences[0]) != len(sequences[1])  # the batch is padded
    assert sequences[2][-1] == reward.tokenizer.eos_id
    with torch.no_grad():
        expected = torch.stack([reference(input_ids=torch.tensor([s])).logits[0, 0] for s in sequences])
    assert scores.shape == (3,) and scores.dtype == torch.float32
    torch.testing.assert_close(scores, expected, atol=1e-5, rtol=0)
    assert not reward.model.training
    assert not any(p.requires_grad for p in reward.model.parameters())


def test_tokenizes_as_the_preference_dataset(assets, tmp_path, monkeypatch):
    # the reward model was trained on preference_dataset's tokens: the reward must score the same sequences
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    reward = _reward(assets, "reward", tmp_path)
    (prompt, chosen), (_, rejected), _ = PAIRS
    row = {
        "chosen": [{"role": "user", "content": prompt}, {"role": "assistant", "content": chosen}],
        "rejected": [{"role": "user", "content": prompt}, {"role": "assistant", "content": rejected}],
    }
    (tmp_path / "pairs.json").write_text(json.dumps([row]))
    data = preference_dataset(reward.tokenizer, source="json", data_files=str(tmp_path / "pairs.json"))
    assert list(data[0]["chosen_input_ids"]) == reward.tokenize(prompt, chosen)
    assert list(data[0]["rejected_input_ids"]) == reward.tokenize(prompt, rejected)


def test_a_checkpoint_that_is_not_a_classifier_is_a_clear_error(assets, tmp_path):
    with pytest.raises(ValueError, match=r"output\.weight: checkpoint \(320, 32\), model \(1, 32\).*ForSequenceClass"):
        _reward(assets, "causal_lm", tmp_path)


def test_empty_batch_and_bad_batch_size(assets, tmp_path):
    reward = _reward(assets, "reward", tmp_path)
    assert reward([], []).shape == (0,)
    with pytest.raises(ValueError, match="batch_size"):
        RewardModelReward(reward.model, reward.tokenizer, None, batch_size=0)
