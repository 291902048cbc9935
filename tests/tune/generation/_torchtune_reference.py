"""The tiny decoder of the generation tests, and the script that wrote their torchtune 0.6.1 literals.

Run from the repository root with torchtune 0.6.1's environment (torch 2.13, as tune's):

    /path/to/torchtune-venv/bin/python -m tests.tune.generation._torchtune_reference

It builds the tests' decoder from tune.modules and runs ``torchtune.generation.generate`` and ``sample`` on it
(without a KV cache: torchtune's recomputing path), printing ``TORCHTUNE_OUTPUTS`` as pasted into
test_generation.py.
"""

import torch
from torch import nn

from tune.modules import (
    FeedForward,
    MultiHeadAttention,
    RMSNorm,
    RotaryPositionalEmbeddings,
    TransformerDecoder,
    TransformerSelfAttentionLayer,
)

VOCAB = 64
# different lengths: the second row is left-padded by 3 (pad id 0)
PADDED_PROMPT = [[5, 9, 3, 7, 1, 2], [0, 0, 0, 11, 4, 8]]
# the calls whose torchtune results the tests compare with: name -> (generate's keyword arguments, global seed)
CALLS = {
    "greedy": (dict(max_generated_tokens=8, temperature=0.0), None),
    "stop": (dict(max_generated_tokens=8, temperature=0.0, stop_tokens=[23, 15]), None),
    "rng": (dict(max_generated_tokens=6, temperature=0.9, top_k=20, rng=3), None),
    "global_seed": (dict(max_generated_tokens=6, temperature=0.9, top_k=20), 5),
}


def tiny_decoder(max_seq_len: int = 48) -> TransformerDecoder:
    """A 2-layer GQA decoder built straight from tune.modules (no family code involved)."""
    torch.manual_seed(0)
    dim, num_heads, num_kv_heads, head_dim = 32, 4, 2, 8
    rope = RotaryPositionalEmbeddings(head_dim, max_seq_len)
    layers = []
    for _ in range(2):
        attn = MultiHeadAttention(
            embed_dim=dim,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            q_proj=nn.Linear(dim, num_heads * head_dim, bias=False),
            k_proj=nn.Linear(dim, num_kv_heads * head_dim, bias=False),
            v_proj=nn.Linear(dim, num_kv_heads * head_dim, bias=False),
            output_proj=nn.Linear(num_heads * head_dim, dim, bias=False),
            pos_embeddings=rope,
            max_seq_len=max_seq_len,
        )
        mlp = FeedForward(
            gate_proj=nn.Linear(dim, 64, bias=False),
            down_proj=nn.Linear(64, dim, bias=False),
            up_proj=nn.Linear(dim, 64, bias=False),
        )
        layers.append(TransformerSelfAttentionLayer(attn, mlp, sa_norm=RMSNorm(dim), mlp_norm=RMSNorm(dim)))
    return TransformerDecoder(
        tok_embeddings=nn.Embedding(VOCAB, dim),
        layers=layers,
        max_seq_len=max_seq_len,
        num_heads=num_heads,
        head_dim=head_dim,
        norm=RMSNorm(dim),
        output=nn.Linear(dim, VOCAB, bias=False),
    ).eval()


def call_kwargs(name: str) -> dict:
    """The keyword arguments of a call of ``CALLS``, with a fresh generator where it takes one (a seed there)."""
    kwargs = dict(CALLS[name][0])
    if "rng" in kwargs:
        kwargs["rng"] = torch.Generator().manual_seed(kwargs["rng"])
    return kwargs


def main() -> None:
    from torchtune.generation import generate, sample

    model = tiny_decoder()
    outputs = {}
    for name, (_, seed) in CALLS.items():
        if seed is not None:
            torch.manual_seed(seed)
        tokens, logits = generate(model, torch.tensor(PADDED_PROMPT), **call_kwargs(name))
        outputs[name] = (tokens.tolist(), str(tokens.dtype), list(logits.shape))
    torch.manual_seed(0)
    logits = torch.randn(4, 10)
    torch.manual_seed(1)
    drawn = sample(logits, temperature=0.8, top_k=5)
    outputs["sample"] = (drawn.tolist(), str(drawn.dtype), list(drawn.shape))
    print("TORCHTUNE_OUTPUTS = {")
    for name, value in outputs.items():
        print(f"    {name!r}: {value!r},")
    print("}")


if __name__ == "__main__":
    main()
