"""tune.models.qwen2 (torchtune's Qwen2 names on the Qwen2.5 architecture): chat parity with the real
Qwen2-Instruct template, converters with torchtune's arguments, logits against transformers' Qwen2 at tiny size."""

import pytest
import torch

from tests.tune.data._tiny_tokenizers import as_dicts, conversation, hf_ids, qwen_tokenizer_json
from tests.tune.models._hf_cases import build_hf_model, decoder_dims, padded_batch, qwen2_config
from tune.data import mask_messages
from tune.models.qwen2 import Qwen2Tokenizer, qwen2, qwen2_hf_to_tune, qwen2_tokenizer, qwen2_tune_to_hf
from tune.modules import get_causal_mask_from_padding_mask

transformers = pytest.importorskip("transformers")

# Chat template of Qwen/Qwen2-7B-Instruct (tokenizer_config.json), verbatim.
QWEN2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.mark.parametrize("system", [True, False])
def test_chat_tokens_match_the_qwen2_template(system):
    path = str(qwen_tokenizer_json() / "tokenizer.json")
    ours = qwen2_tokenizer(path)
    reference = transformers.PreTrainedTokenizerFast(tokenizer_file=path, chat_template=QWEN2_TEMPLATE)
    messages = mask_messages(conversation(system=system))
    tokens, _ = ours.tokenize_messages(messages)
    assert isinstance(ours, Qwen2Tokenizer)
    assert tokens == hf_ids(reference, as_dicts(messages))
    with pytest.raises(ValueError, match="bos_token"):
        Qwen2Tokenizer(path, None, bos_token="<s>")


def test_converters_with_torchtune_arguments_load_transformers_weights():
    config = qwen2_config()  # tied embeddings
    hf = build_hf_model(config)
    model = qwen2(
        **decoder_dims(config),
        rope_base=1_000_000.0,
        tie_word_embeddings=True,
    )
    hf_state = hf.state_dict()
    model.load_state_dict(qwen2_hf_to_tune(hf_state, 6, 2, 60, tie_word_embeddings=True))
    tokens, attention_mask, positions = padded_batch()
    with torch.no_grad():
        expected = hf(tokens, attention_mask=attention_mask, position_ids=positions).logits
        actual = model(tokens, mask=get_causal_mask_from_padding_mask(attention_mask.bool()), input_pos=positions)
    real = attention_mask.bool()
    torch.testing.assert_close(actual[real], expected[real], atol=1e-5, rtol=1e-5)
    back = qwen2_tune_to_hf(model.state_dict(), 6, 2, 60, tie_word_embeddings=True)
    assert sorted(back) == sorted(k for k in hf_state if k != "lm_head.weight")
