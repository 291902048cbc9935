"""An independent value check of recipes/grpo_full_finetune_single_device.py: a `tune run` of several GRPO steps
(real updates, fp32, ``ppo_epochs`` 2 so the second pass is off-policy and clipped, a KL penalty to the starting
model) against a plain PyTorch loop written here from the GRPO objective (Shao et al., 2024, eq. 3, with the
per-token ratio clipping and the k3 KL estimator that TRL's ``GRPOTrainer`` and torchtune use).

The loop shares with the recipe only what the objective takes as given: the model class and its starting weights,
the prompts, the sampling rule (``tune.rlhf.completion_generators`` with ``tune.generation.generate``, re-run on
the loop's own policy at each step) and the reward functions. Everything the recipe computes for the update is
written out here: the attention mask and positions of the left-padded rows, the per-token log-probabilities, the
group-normalised advantages, the clipped surrogate, the KL term, the averaging (per completion, then over the
whole batch at once where the recipe accumulates micro-batches of 3), the two passes over each batch with the
first pass's log-probabilities as the old policy, and AdamW.

What this cannot tell apart: the tiny random model never samples EOS within 6 tokens, so every completion has the
same length and the per-completion average (``grpo``) equals the per-token one (``bnpo``). The loss types'
normalisations are checked against TRL (tests/tune/rlhf/loss/test_grpo.py, tests/tune/rlhf/test_grpo_loss_fp32_trl.py).
"""

import shutil

import pytest
import torch
import torch.nn.functional as F

from tests.recipes.assets.grpo_components import digit_share
from tests.recipes.test_grpo_full_finetune_single_device import CONFIG, RECIPE, write_sum_prompts
from tests.recipes.utils import read_jsonl, run_recipe
from tune import generation, rlhf
from tune.datasets import prompt_dataset
from tune.models.llama2 import llama2, llama2_tokenizer
from tune.training import FullModelHFCheckpointer

pytestmark = pytest.mark.integration

NUM_STEPS, BATCH, GROUP, PPO_EPOCHS = 3, 2, 4, 2
EPSILON, BETA, LR, MAX_NEW = 0.2, 0.04, 3e-2, 6
# fp32: the recipe and the loop add the same numbers in a different order (micro-batches of 3 against one batch).
# Measured: the losses agree to 8e-7. AdamW divides each gradient by its running RMS, so where a weight's gradient
# is small its rounding difference moves the weight by a share of the LR (3e-2): after 6 optimizer steps the weights
# agree to 1e-4 (max) while training moved them by 0.17, and the whole update (trained - start) to 4e-6 relative.
LOSS_ATOL, WEIGHT_ATOL, UPDATE_RTOL = 1e-5, 5e-4, 1e-4


def _tiny_llama() -> torch.nn.Module:
    # the dimensions of tests/recipes/assets/grpo_tiny.yaml
    return llama2(
        vocab_size=320,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        embed_dim=128,
        intermediate_dim=256,
        max_seq_len=512,
        attn_dropout=0.0,
        norm_eps=1e-5,
    )


def _load(directory, scratch) -> dict[str, torch.Tensor]:
    checkpointer = FullModelHFCheckpointer(
        checkpoint_dir=str(directory),
        checkpoint_files=["model.safetensors"],
        model_type="LLAMA2",
        output_dir=str(scratch),
    )
    return checkpointer.load_checkpoint()["model"]


def _completion_log_probs(model, prompts, padding, completions) -> torch.Tensor:
    """[n, t] log p(completion token | prompt, earlier completion tokens), each left-padded row as if alone."""
    tokens = torch.cat([prompts, completions], dim=1)
    real = torch.cat([padding, torch.ones_like(completions, dtype=torch.bool)], dim=1)  # [n, s]
    length = tokens.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    mask = causal[None] & real[:, None, :]  # [n, s, s]: attend to earlier real tokens only
    mask |= torch.eye(length, dtype=torch.bool)[None]  # a padding row attends to itself (its output is unused)
    positions = (real.long().cumsum(dim=1) - 1).clamp(min=0)
    logits = model(tokens, mask=mask, input_pos=positions)
    # position i predicts token i + 1: the completion is predicted from the prompt's last position on
    log_probs = F.log_softmax(logits[:, prompts.shape[1] - 1 : -1].float(), dim=-1)
    return log_probs.gather(-1, completions[..., None]).squeeze(-1)


def _grpo_loss(log_probs, old, ref, advantages, mask) -> torch.Tensor:
    """The GRPO objective, negated: per token min(r A, clip(r) A) - beta KL, averaged over each completion's tokens,
    then over the completions."""
    ratio = torch.exp(log_probs - old)
    surrogate = torch.minimum(ratio * advantages[:, None], ratio.clamp(1 - EPSILON, 1 + EPSILON) * advantages[:, None])
    kl = torch.exp(ref - log_probs) - (ref - log_probs) - 1  # k3: unbiased and >= 0 (Schulman, 2020)
    per_token = -(surrogate - BETA * kl)
    mask = mask.float()
    return ((per_token * mask).sum(dim=1) / mask.sum(dim=1)).mean()


def _plain_grpo(
    tiny_assets, checkpoint, prompts_file, scratch
) -> tuple[list[float], list[float], dict[str, torch.Tensor]]:
    """The loop: per step, sample GROUP completions of BATCH prompts, score them, and take PPO_EPOCHS AdamW steps.
    Returns the losses per step (the mean of its passes), the clipped share of tokens per step, and the weights."""
    tokenizer = llama2_tokenizer(str(tiny_assets / "tokenizer.model"), max_seq_len=256, prompt_template=None)
    dataset = prompt_dataset(tokenizer, source="json", data_files=str(prompts_file), split="train")
    start = _load(checkpoint, scratch)
    model, reference = _tiny_llama(), _tiny_llama()
    model.load_state_dict(start)
    reference.load_state_dict(start)
    reference.requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0, foreach=False)
    stop_tokens = list(tokenizer.stop_tokens)
    losses, clipped = [], []
    for step in range(NUM_STEPS):
        indices = list(range(step * BATCH, (step + 1) * BATCH))  # shuffle=False: the file's order
        rows = [dataset[i] for i in indices]
        with torch.no_grad():
            prompts, padding = generation.left_pad([r["tokens"] for r in rows for _ in range(GROUP)], tokenizer.pad_id)
            generators = rlhf.completion_generators(0, 0, indices, GROUP)
            sequences, _ = generation.generate(
                model,
                prompts,
                max_generated_tokens=MAX_NEW,
                pad_id=tokenizer.pad_id,
                temperature=1.0,
                stop_tokens=stop_tokens,
                rng=generators,
                return_logits=False,
            )
            completions = sequences[:, prompts.shape[1] :]
            # a completion ends with its first stop token (kept); what follows is not its own
            is_stop = torch.isin(completions, torch.tensor(stop_tokens))
            mask = (is_stop.long().cumsum(dim=1) - is_stop.long()) == 0
            texts = []
            for row, keep in zip(completions.tolist(), mask.tolist()):
                kept = [t for t, k in zip(row, keep) if k]
                texts.append(tokenizer.decode(kept[:-1] if kept and kept[-1] in stop_tokens else kept))
            answers = [r["answer"] for r in rows for _ in range(GROUP)]
            prompt_texts = [r["prompt"] for r in rows for _ in range(GROUP)]
            rewards = rlhf.AnswerReward()(prompt_texts, texts, answer=answers) + 0.5 * digit_share(prompt_texts, texts)
            grouped = rewards.float().view(BATCH, GROUP)
            advantages = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).flatten()
            ref = _completion_log_probs(reference, prompts, padding, completions)
        old, passes, num_clipped = None, [], 0.0
        for _ in range(PPO_EPOCHS):
            log_probs = _completion_log_probs(model, prompts, padding, completions)
            if old is None:
                old = log_probs.detach()  # the first pass's policy sampled the batch
            loss = _grpo_loss(log_probs, old, ref, advantages, mask)
            ratio = torch.exp(log_probs.detach() - old)
            outside = ((ratio < 1 - EPSILON) & (advantages[:, None] < 0)) | (
                (ratio > 1 + EPSILON) & (advantages[:, None] > 0)
            )
            num_clipped += (outside & mask).sum().item() / mask.sum().item()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            passes.append(loss.item())
        losses.append(sum(passes) / PPO_EPOCHS)
        clipped.append(num_clipped / PPO_EPOCHS)
    return losses, clipped, model.state_dict()


def test_grpo_recipe_equals_a_plain_grpo_loop(tiny_assets, tmp_path):
    prompts = write_sum_prompts(tmp_path / "prompts.json")
    checkpoint = tiny_assets / "llama"
    out = tmp_path / "run"
    overrides = [
        f"assets_dir={tiny_assets}",
        f"output_dir={out}",
        f"dataset.data_files={prompts}",
        "shuffle=False",
        f"batch_size={BATCH}",
        f"grpo_samples={GROUP}",
        f"ppo_epochs={PPO_EPOCHS}",
        f"max_generated_tokens={MAX_NEW}",
        f"optimizer.lr={LR}",
        f"loss.epsilon={EPSILON}",
        f"loss.beta={BETA}",
        f"max_steps_per_epoch={NUM_STEPS}",
        "forward_batch_size=3",  # the recipe accumulates micro-batches; the loop takes the batch at once
    ]
    run_recipe(RECIPE, CONFIG, overrides, cwd=tmp_path)
    log = {r["step"]: r for r in read_jsonl(out / "logs" / "log.jsonl") if "loss" in r}
    assert sorted(log) == list(range(1, NUM_STEPS + 1))

    losses, clipped, weights = _plain_grpo(tiny_assets, checkpoint, prompts, tmp_path / "scratch")
    recipe_losses = [log[step]["loss"] for step in sorted(log)]
    print("GRPO losses, recipe:", recipe_losses, "plain loop:", losses)
    # the check has teeth: the advantages carry a signal, the policy moved (KL) and the second passes clipped
    assert all(log[step]["reward_std"] > 0 for step in log)
    assert log[NUM_STEPS]["kl"] > 0 and max(clipped) > 0
    for step, (ours, plain) in enumerate(zip(recipe_losses, losses), start=1):
        assert ours == pytest.approx(plain, abs=LOSS_ATOL, rel=0), (step, recipe_losses, losses)
        assert log[step]["clip_ratio/region_mean"] == pytest.approx(clipped[step - 1], abs=1e-6), step

    trained = _load(out / f"step_{NUM_STEPS}", tmp_path / "scratch")
    start = _load(checkpoint, tmp_path / "scratch")
    max_diff = max((trained[k] - weights[k]).abs().max().item() for k in weights)
    moved = max((trained[k] - start[k]).abs().max().item() for k in weights)
    update = torch.cat([(trained[k] - start[k]).flatten() for k in weights])
    update_error = torch.cat([(trained[k] - weights[k]).flatten() for k in weights]).norm() / update.norm()
    print(
        f"final weights: max |recipe - plain| {max_diff:.3g} (moved {moved:.3g}), update rel. error {update_error:.3g}"
    )
    assert max_diff < WEIGHT_ATOL and update_error < UPDATE_RTOL
    shutil.rmtree(tmp_path / "scratch", ignore_errors=True)
