"""An independent value check of recipes/ppo_full_finetune_single_device.py beyond its first, on-policy update: one
PPO step with ``ppo_epochs`` 2 over 2 shuffled minibatches (4 optimizer steps, the later ones off-policy, with the
policy ratio and the value clipping both active) against a plain loop written here with the Hugging Face models.

The loop takes from the recipe only the trajectories it generated (prompts and sampled responses) and the state of
its generator before each step's updates (which orders the minibatches). The rest is written out from the equations and
computed with transformers' models: the old and reference log-probabilities, the values and the scores, the
per-token rewards (Ziegler et al. 2019, eq. 2), GAE advantages and returns (Schulman et al. 2015, eq. 16) and their
whitening, the clipped surrogate (Schulman et al. 2017, eq. 7) and the clipped value loss over each whole minibatch
(the recipe splits it in micro-batches of 1), and the SGD steps on the policy and the value model.
"""

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from tests.recipes.test_ppo_full_finetune_single_device import (  # noqa: F401  (ppo_assets: a fixture)
    CONFIG,
    PAD,
    _load_recipe_module,
    _overrides,
    ppo_assets,
)
from tests.recipes.utils import read_jsonl

LR, KL_COEFF, TEMPERATURE, GAMMA, LMBDA = 0.1, 0.05, 0.9, 1.0, 0.95
EPSILON, VALUE_CLIP, VALUE_COEFF, PPO_EPOCHS, MINIBATCH = 0.2, 0.02, 0.1, 2, 2
NUM_STEPS = 2  # the KL penalty is 0 on the first step (the policy is the reference): the second one has it
# fp32, the same numbers summed in another order (micro-batches of 1, transformers' eager attention). Measured: the
# logged means agree to 2.4e-6 relative (value loss ~51: 1.1e-4); the weights after 8 SGD steps to 2.5e-5 of how far
# they moved (policy: 6.9e-6 of 0.28; value model: 2.5e-6 of 0.37)
ATOL, RTOL, WEIGHT_RTOL = 1e-5, 1e-5, 2e-4


def _hf_models(assets):
    from transformers import LlamaForCausalLM, LlamaForSequenceClassification

    def causal():
        return LlamaForCausalLM.from_pretrained(assets / "llama", dtype=torch.float32, attn_implementation="eager")

    def scorer():
        return LlamaForSequenceClassification.from_pretrained(
            assets / "rm", dtype=torch.float32, attn_implementation="eager"
        )

    return causal(), causal(), scorer(), scorer()


def _plain_ppo_step(models, trajectory, rng_state):
    """One PPO step on the recipe's trajectory: returns the means of the minibatch losses and the numbers of
    clipped ratios and clipped values."""
    policy, reference, value_model, reward_model = models
    tokens, response_pad = trajectory.query_responses, trajectory.response_padding_masks
    batch, response_len = response_pad.shape
    prompt_len = tokens.shape[1] - response_len
    real = torch.cat([(tokens[:, :prompt_len] != PAD).cumsum(-1) > 0, torch.ones_like(response_pad)], dim=1)
    positions = (real.long().cumsum(-1) - 1).clamp(min=0)
    responses, kept = tokens[:, prompt_len:], ~response_pad
    lengths = kept.sum(-1)

    def forward(rows):
        inputs = dict(input_ids=tokens[rows], attention_mask=real[rows].long(), position_ids=positions[rows])
        logits = policy(**inputs).logits[:, prompt_len - 1 : -1] / TEMPERATURE
        logprobs = F.log_softmax(logits, dim=-1).gather(-1, responses[rows][..., None])[..., 0]
        values = value_model.score(value_model.model(**inputs).last_hidden_state)[:, prompt_len - 1 : -1, 0]
        return logprobs, values

    everything = torch.arange(batch)
    with torch.no_grad():
        old_logprobs, old_values = forward(everything)
        inputs = dict(input_ids=tokens, attention_mask=real.long(), position_ids=positions)
        ref_logits = reference(**inputs).logits[:, prompt_len - 1 : -1] / TEMPERATURE
        ref_logprobs = F.log_softmax(ref_logits, dim=-1).gather(-1, responses[..., None])[..., 0]
        per_position = reward_model.score(reward_model.model(**inputs).last_hidden_state)[..., 0]
        scores = per_position[everything, prompt_len + lengths - 1]  # the score of the response's last token

    # rewards, GAE and returns, response by response and token by token
    advantages, returns = torch.zeros(batch, response_len), torch.zeros(batch, response_len)
    for i in range(batch):
        n = int(lengths[i])
        rewards = [-KL_COEFF * float(old_logprobs[i, t] - ref_logprobs[i, t]) for t in range(n)]
        rewards[-1] += float(scores[i])
        values = [*old_values[i, :n].tolist(), 0.0]  # after the last token: terminal
        gae = 0.0
        for t in reversed(range(n)):
            gae = rewards[t] + GAMMA * values[t + 1] - values[t] + GAMMA * LMBDA * gae
            advantages[i, t], returns[i, t] = gae, gae + values[t]
    mean, var = advantages[kept].mean(), advantages[kept].var()  # whitened, the mean kept (torchtune's whiten)
    advantages = torch.where(kept, (advantages - mean) / torch.sqrt(var + 1e-8) + mean, 0.0)

    generator = torch.Generator().set_state(rng_state)
    records, clipped_ratios, clipped_values = [], 0, 0
    for _ in range(PPO_EPOCHS):
        for rows in torch.randperm(batch, generator=generator).split(MINIBATCH):
            logprobs, values = forward(rows)
            mask, adv, old_v = kept[rows], advantages[rows], old_values[rows]
            ratio = torch.exp(logprobs - old_logprobs[rows])
            surrogate = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - EPSILON, 1 + EPSILON))
            values_clipped = old_v + (values - old_v).clamp(-VALUE_CLIP, VALUE_CLIP)
            errors = torch.maximum((values - returns[rows]) ** 2, (values_clipped - returns[rows]) ** 2)
            policy_loss = surrogate[mask].mean()  # means over the minibatch's response tokens
            value_loss = 0.5 * errors[mask].mean()
            loss = policy_loss + VALUE_COEFF * value_loss
            policy.zero_grad()
            value_model.zero_grad()
            loss.backward()
            with torch.no_grad():
                for model in (policy, value_model):
                    for param in model.parameters():
                        if param.grad is not None:
                            param -= LR * param.grad
            clipped_ratios += int(((ratio - 1).abs() > EPSILON)[mask].sum())
            clipped_values += int(((values - old_v).abs() > VALUE_CLIP)[mask].sum())
            records.append((loss.item(), policy_loss.item(), value_loss.item()))
    means = {k: sum(r[i] for r in records) / len(records) for i, k in enumerate(("loss", "policy_loss", "value_loss"))}
    return means, clipped_ratios, clipped_values


def test_ppo_epochs_2_equal_a_plain_loop(ppo_assets, tmp_path, monkeypatch):  # noqa: F811
    from tune import config

    overrides = _overrides(
        ppo_assets,
        tmp_path / "run",
        f"num_steps={4 * NUM_STEPS}",  # PPO steps of 4 trajectories
        f"ppo_epochs={PPO_EPOCHS}",
        f"ppo_batch_size={MINIBATCH}",
        "gradient_accumulation_steps=2",
        "optimizer._component_=torch.optim.SGD",
        f"optimizer.lr={LR}",
        "~optimizer.foreach",
        f"kl_coeff={KL_COEFF}",
        f"temperature={TEMPERATURE}",
        "max_generated_tokens=8",
        f"loss.epsilon={EPSILON}",
        f"loss.value_clip_range={VALUE_CLIP}",
        f"loss.value_coeff={VALUE_COEFF}",
    )
    cfg = config.load_config(CONFIG, overrides)
    config.apply_defaults(cfg, ["finetune"])
    recipe = _load_recipe_module().PPOFullFinetuneRecipeSingleDevice(cfg)
    recipe.setup(cfg)
    captured = []
    updates = recipe._ppo_updates

    def recording(trajectory, *args):
        captured.append((trajectory, recipe._rng.get_state()))
        return updates(trajectory, *args)

    monkeypatch.setattr(recipe, "_ppo_updates", recording)
    recipe.train()
    recipe.cleanup()
    assert len(captured) == NUM_STEPS

    models = _hf_models(ppo_assets)
    records = {r["step"]: r for r in read_jsonl(tmp_path / "run" / "logs" / "log.jsonl") if "loss" in r}
    for step, (trajectory, rng_state) in enumerate(captured, start=1):
        expected, clipped_ratios, clipped_values = _plain_ppo_step(models, trajectory, rng_state)
        record = records[step]
        print(
            step, {k: (record[k], v, abs(record[k] - v)) for k, v in expected.items()}, clipped_ratios, clipped_values
        )
        # off-policy passes that clip: the ratios left [0.8, 1.2] and the values left their clip range
        assert clipped_ratios > 0 and clipped_values > 0 and record["clipfrac"] > 0
        for key, value in expected.items():
            assert abs(record[key] - value) <= ATOL + RTOL * abs(value), (step, key, record[key], value)
    assert records[NUM_STEPS]["kl"] != 0  # the KL penalty is in the rewards of the last step
    policy, value_model = models[0].state_dict(), models[2].state_dict()
    for name, reference, start in (("", policy, "llama"), ("value", value_model, "rm")):
        saved = load_file(tmp_path / "run" / name / f"step_{NUM_STEPS}" / "model.safetensors")
        original = load_file(ppo_assets / start / "model.safetensors")
        assert saved.keys() == reference.keys()
        apart = max((reference[k] - v).abs().max().item() for k, v in saved.items())
        moved = max((original[k] - v).abs().max().item() for k, v in saved.items())
        print(f"{name or 'policy'} weights: max |recipe - plain| {apart:.2e}, moved {moved:.2e}")
        assert apart <= WEIGHT_RTOL * moved
