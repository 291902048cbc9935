"""Phi-4 (tune/models/phi4): tokenizer parity with transformers' apply_chat_template on Phi-4's template with exact
masks, both file routes (tokenizer.json; vocab.json + merges.txt), and the model against transformers' Phi-3
architecture (which Phi-4 checkpoints name) with the size table's settings."""

import pytest
import torch

from tests.recipes._family_assets import phi4_tokenizer_dir
from tests.tune.data._tiny_tokenizers import as_dicts, conversation, hf_ids, random_conversations, trained_runs
from tune.data import Message, mask_messages
from tune.models.phi3 import lora_phi3, phi3
from tune.models.phi4 import FAMILY, phi4_14b, phi4_tokenizer
from tune.models.phi4._model_builders import MODEL_SIZES
from tune.models.phi4._tokenizer import PHI4_SPECIAL_TOKENS
from tune.registry import get_model_family

transformers = pytest.importorskip("transformers")

# Chat template of microsoft/phi-4 (tokenizer_config.json), verbatim.
PHI4_TEMPLATE = (
    "{% for message in messages %}{% if (message['role'] == 'system') %}"
    "{{'<|im_start|>system<|im_sep|>' + message['content'] + '<|im_end|>'}}"
    "{% elif (message['role'] == 'user') %}{{'<|im_start|>user<|im_sep|>' + message['content'] + '<|im_end|>'}}"
    "{% elif (message['role'] == 'assistant') %}"
    "{{'<|im_start|>assistant<|im_sep|>' + message['content'] + '<|im_end|>'}}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant<|im_sep|>' }}{% endif %}"
)


@pytest.fixture(scope="module")
def ours():
    return phi4_tokenizer(str(phi4_tokenizer_dir() / "tokenizer.json"))


@pytest.fixture(scope="module")
def reference():
    return transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(phi4_tokenizer_dir() / "tokenizer.json"),
        eos_token="<|im_end|>",
        pad_token="<|dummy_85|>",
        chat_template=PHI4_TEMPLATE,
    )


def _runs(tokenizer, tokens, mask):
    return [tokenizer.decode(run, skip_special_tokens=False) for run in trained_runs(tokens, mask)]


@pytest.mark.parametrize("system", [True, False])
def test_chat_parity_and_exact_mask(ours, reference, system):
    messages = mask_messages(conversation(system=system))
    tokens, mask = ours.tokenize_messages(messages)
    assert tokens == hf_ids(reference, as_dicts(messages))
    assert _runs(ours, tokens, mask) == [m.text_content + "<|im_end|>" for m in messages if m.role == "assistant"]
    assert tokens[0] == ours.special_tokens["<|im_start|>"]  # no BOS, as the template


def test_generation_prompt_parity(ours, reference):
    messages = mask_messages(
        [Message("user", "Why? Please explain."), Message("assistant", "Because."), Message("user", "Ok")]
    )
    tokens, _ = ours.tokenize_messages(messages, add_end_tokens=False)
    assert tokens == hf_ids(reference, as_dicts(messages), add_generation_prompt=True)
    assert ours.decode(tokens[-3:], skip_special_tokens=False) == "<|im_start|>assistant<|im_sep|>"


def test_parity_on_random_conversations(ours, reference):
    for messages in random_conversations(count=25, seed=2):
        tokens, mask = ours.tokenize_messages(mask_messages(messages))
        assert tokens == hf_ids(reference, as_dicts(messages)), as_dicts(messages)
        assert _runs(ours, tokens, mask) == [m.text_content + "<|im_end|>" for m in messages if m.role == "assistant"]


def test_special_ids_and_vocab_merges_route(ours):
    # torchtune's Phi-4 ids: 96 special tokens 100256-100351, <|dummy_85|> (its pad) at 100349
    assert sorted(PHI4_SPECIAL_TOKENS.values()) == list(range(100256, 100352))
    assert PHI4_SPECIAL_TOKENS["<|im_end|>"] == 100265 and PHI4_SPECIAL_TOKENS["<|dummy_85|>"] == 100349
    base = ours.special_tokens["<|endoftext|>"] - 1  # the tiny BPE: special tokens after its own entries
    assert {t: ours.special_tokens[t] - base for t in ("<|im_start|>", "<|im_end|>", "<|im_sep|>")} == {
        t: PHI4_SPECIAL_TOKENS[t] - 100256 for t in ("<|im_start|>", "<|im_end|>", "<|im_sep|>")
    }
    assert (ours.eos_id, ours.pad_id) == (ours.special_tokens["<|im_end|>"], ours.special_tokens["<|dummy_85|>"])
    assert ours.stop_tokens == [ours.eos_id, ours.bos_id] and ours.bos_id == ours.special_tokens["<|endoftext|>"]
    directory = phi4_tokenizer_dir()
    # the chat format named: torchtune's files alone give torchtune's layout (tests/recipes/test_torchtune_tokens.py)
    from_files = phi4_tokenizer(
        str(directory / "vocab.json"), str(directory / "merges.txt"), prompt_template="tune.data.Phi4ChatFormat"
    )
    messages = mask_messages(conversation())
    assert from_files.tokenize_messages(messages) == ours.tokenize_messages(messages)
    assert from_files.special_tokens == ours.special_tokens
    with pytest.raises(ValueError, match="vocab_path"):
        phi4_tokenizer()
    with pytest.raises(FileNotFoundError, match="merges.txt"):
        phi4_tokenizer(str(directory / "vocab.json"), str(directory / "missing.txt"))


def test_registry_name():
    # torchtune's checkpointer model_type; config.json's model_type "phi3" loads through the phi3 family
    # (tests/tune/models/test_families.py), the size's settings are checked in test_model_builders.py
    assert get_model_family("PHI4") is FAMILY and FAMILY.from_hf_config is None
    assert FAMILY.builders["phi4_14b"] is phi4_14b


def _tiny_hf_phi4():
    # microsoft/phi-4's settings (rope_theta 250000, no sliding window, untied, eps 1e-5) at tiny dimensions
    dims = MODEL_SIZES["phi4_14b"].dims
    return transformers.Phi3Config(
        vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32, original_max_position_embeddings=32,
        rope_theta=dims["rope_base"], rms_norm_eps=dims["norm_eps"], sliding_window=dims["sliding_window"],
        tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip


@pytest.mark.parametrize("lora", [False, True])
def test_size_table_settings_match_transformers_logits(lora):
    from tests.tune.models._hf_cases import build_hf_model

    config = _tiny_hf_phi4()
    hf_model = build_hf_model(config)
    dims = dict(MODEL_SIZES["phi4_14b"].dims)
    dims.update(vocab_size=101, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=64, intermediate_dim=96)
    dims.update(max_seq_len=32)
    if lora:  # LoRA layers start as the identity (B = 0): the same logits
        model = lora_phi3(["q_proj", "v_proj", "output_proj"], apply_lora_to_mlp=True, **dims)
    else:
        model = phi3(**dims)
    state = FAMILY.hf_to_tune(hf_model.state_dict(), config.to_dict())
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("lora" in key for key in missing)
    tokens = torch.randint(3, 101, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected, actual = hf_model(tokens).logits, model(tokens)
    error = (expected - actual).abs().max().item()
    print(f"phi4 tiny (lora={lora}): max abs logit error {error:.3e}")
    assert expected.abs().max() > 1.0 and error < 1e-5
    back = FAMILY.tune_to_hf({k: v for k, v in model.state_dict().items() if "lora" not in k}, config.to_dict())
    assert all(torch.equal(back[key], value) for key, value in hf_model.state_dict().items())
