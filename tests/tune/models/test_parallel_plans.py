"""The tensor-parallel plans of tune/models/_parallel.py: which modules each family splits, and how.

That the plans train exactly like one process is checked with 2 processes in tests/tune/training/test_parallel.py.
"""

import pytest
import torch
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

from tune.models.llama3 import base_llama_tp_plan, llama3
from tune.models.qwen2_5 import base_qwen_tp_plan
from tune.models.qwen3 import qwen3
from tune.registry import get_model_family

SIZES = dict(
    vocab_size=64, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=32, max_seq_len=32, intermediate_dim=48
)
LAYER_STYLES = {
    "layers.*.attn.q_proj": ColwiseParallel,
    "layers.*.attn.k_proj": ColwiseParallel,
    "layers.*.attn.v_proj": ColwiseParallel,
    "layers.*.attn.output_proj": RowwiseParallel,
    "layers.*.mlp.w1": ColwiseParallel,
    "layers.*.mlp.w3": ColwiseParallel,
    "layers.*.mlp.w2": RowwiseParallel,
}


def _styles(plan: dict) -> dict:
    return {key: type(style) for key, style in plan.items()}


def test_untied_llama_splits_layers_embedding_and_output():
    with torch.device("meta"):
        model = llama3(**SIZES)
    plan = base_llama_tp_plan(model)
    assert _styles(plan) == {**LAYER_STYLES, "tok_embeddings": RowwiseParallel, "output": ColwiseParallel}
    # logits are gathered whole for the loss; token ids arrive whole on every rank
    assert plan["output"].output_layouts == (Replicate(),)
    assert plan["tok_embeddings"].input_layouts == (Replicate(),)
    assert base_llama_tp_plan().keys() == plan.keys()  # without a model: an untied output (8B and up)


def test_tied_qwen3_keeps_embedding_whole_and_sums_the_per_head_norm_gradients():
    with torch.device("meta"):
        model = qwen3(**SIZES, head_dim=8, tie_word_embeddings=True)
    plan = base_qwen_tp_plan(model)
    norms = {"layers.*.attn.q_norm": SequenceParallel, "layers.*.attn.k_norm": SequenceParallel}
    assert _styles(plan) == {**LAYER_STYLES, **norms}  # tied: no tok_embeddings/output entries
    # the norms act on [b, s, heads, head_dim] split over heads: dim 2
    assert plan["layers.*.attn.q_norm"].sequence_sharding[0].dim == 2


@pytest.mark.parametrize(
    "family, plan",
    [(name, base_llama_tp_plan) for name in ("llama2", "llama3", "llama3_1", "llama3_2", "llama3_3", "mistral")]
    + [("qwen2_5", base_qwen_tp_plan), ("qwen3", base_qwen_tp_plan), ("QWEN2", base_qwen_tp_plan)],
)
def test_families_register_their_plan(family, plan):
    assert get_model_family(family).tp_plan is plan
