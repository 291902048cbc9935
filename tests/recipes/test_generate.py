"""Integration tests of recipes/generate.py: greedy continuations equal Hugging Face ``generate`` on the same model.

The reference is ``transformers``' own greedy decoding (``do_sample=False``) of the same prompt tokens, on the
base checkpoint and on the base checkpoint with a PEFT LoRA adapter; the recipe must print the same text.
"""

from pathlib import Path

import pytest
import torch

from tests.recipes.utils import ASSETS, MAX_SEQ_LEN, hf_greedy_tokens, run_recipe

pytestmark = pytest.mark.integration

RECIPE = "generate"
CONFIG = ASSETS / "generation_tiny.yaml"
PROMPT = "Add the two numbers. 12 and 30"
MAX_NEW_TOKENS = 16  # generation_tiny.yaml


def _tokenizer(assets: Path):
    from tune.models.llama2 import llama2_tokenizer

    return llama2_tokenizer(str(assets / "tokenizer.model"), max_seq_len=MAX_SEQ_LEN, prompt_template=None)


def _hf_greedy_text(model, assets: Path, messages: list) -> str:
    tokenizer = _tokenizer(assets)
    prompt, _ = tokenizer.tokenize_messages(messages, add_end_tokens=False)
    new = hf_greedy_tokens(model, prompt, MAX_NEW_TOKENS, tokenizer.eos_id, tokenizer.pad_id)
    assert new, "the reference generated nothing; pick another prompt"
    return tokenizer.decode(new)


def test_greedy_continuation_equals_transformers_generate(tiny_assets, tmp_path):
    from transformers import LlamaForCausalLM

    from tune.data import Message

    proc = run_recipe(
        RECIPE, CONFIG, [f"assets_dir={tiny_assets}", f"output_dir={tmp_path}", f"prompt.user={PROMPT}"], cwd=tmp_path
    )
    model = LlamaForCausalLM.from_pretrained(tiny_assets / "llama", dtype=torch.float32).eval()
    expected = _hf_greedy_text(model, tiny_assets, [Message(role="user", content=PROMPT)])
    assert expected in proc.stdout.splitlines()


def test_chat_messages_with_an_unmerged_peft_adapter(tiny_assets, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    from tune.data import Message

    # a PEFT adapter with random A and B, so that it changes what the model generates
    torch.manual_seed(2)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    base = LlamaForCausalLM.from_pretrained(tiny_assets / "llama", dtype=torch.float32)
    peft_model = get_peft_model(base, config).eval()
    peft_model.save_pretrained(tmp_path / "adapter")

    overrides = [
        f"assets_dir={tiny_assets}",
        f"output_dir={tmp_path}",
        "model._component_=tune.models.llama2.lora_llama2",
        "model.lora_attn_modules=[q_proj, v_proj]",
        "model.lora_rank=4",
        "model.lora_alpha=8",
        f"checkpointer.adapter_checkpoint={tmp_path / 'adapter'}",
        "~prompt",
        "messages=[{role: system, content: Answer with a number.}, {role: user, content: " + PROMPT + "}]",
    ]
    proc = run_recipe(RECIPE, CONFIG, overrides, cwd=tmp_path)
    messages = [Message(role="system", content="Answer with a number."), Message(role="user", content=PROMPT)]
    expected = _hf_greedy_text(peft_model, tiny_assets, messages)
    with peft_model.disable_adapter():
        base_text = _hf_greedy_text(peft_model, tiny_assets, messages)
    assert expected != base_text  # the adapter changes the continuation, so the check below means something
    assert expected in proc.stdout.splitlines()
    assert "unmerged" in proc.stderr
