"""Integration tests of recipes/ppo_full_finetune_single_device.py on the tiny Llama of tests/recipes/utils.py and
a tiny reward model (transformers' ``LlamaForSequenceClassification``) built here.

- The first PPO step equals a plain PyTorch + transformers computation on the trajectory the recipe generated:
  log-probabilities, values and scores from the Hugging Face models, per-token rewards and GAE advantages written
  out from the equations (Ziegler et al. 2019, eq. 2; Schulman et al. 2015, eq. 16), the clipped PPO loss
  (Schulman et al. 2017, eq. 7) over the whole minibatch, and one SGD step: losses and updated weights of the
  policy and of the value model agree within 1e-5 (the recipe splits the minibatch in two micro-batches).
- Resuming from a step checkpoint gives the uninterrupted run's metrics and weights; the outputs load in
  transformers (policy: ``AutoModelForCausalLM``, value model: ``AutoModelForSequenceClassification``).
- Slow tier: PPO learns, on a reward that scores a response's last token by a fixed table over the vocabulary
  (a reward model whose attention and MLP outputs are zero, so its score reads the last token's embedding only).
"""

import importlib.util
import json
import math
import random
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from tests.recipes.utils import ASSETS, ROOT, read_jsonl, run_recipe

pytestmark = pytest.mark.integration

RECIPE = "ppo_full_finetune_single_device"
CONFIG = ASSETS / "ppo_tiny.yaml"
PAD = 0
WORDS = "the a one two three four five six seven eight nine ten add sum of and is what plus".split()


def _write_prompts(path: Path, num_prompts: int) -> Path:
    rng = random.Random(0)
    path.write_text(
        json.dumps([{"prompt": " ".join(rng.choices(WORDS, k=rng.randrange(2, 7)))} for _ in range(num_prompts)])
    )
    return path


def _save_reward_model(llama_dir: Path, out: Path, last_token_only: bool) -> None:
    """A one-output LlamaForSequenceClassification with the tiny Llama's body and a random score head. With
    ``last_token_only`` the attention and MLP outputs are zero: the score depends on the last token alone."""
    from transformers import AutoConfig, LlamaForCausalLM, LlamaForSequenceClassification

    config = AutoConfig.from_pretrained(llama_dir)
    config.num_labels, config.pad_token_id = 1, PAD
    causal = LlamaForCausalLM.from_pretrained(llama_dir, dtype=torch.float32)
    model = LlamaForSequenceClassification(config)
    state = {k: v for k, v in causal.state_dict().items() if k.startswith("model.")}
    if last_token_only:
        state = {
            k: (torch.zeros_like(v) if k.endswith(("o_proj.weight", "down_proj.weight")) else v)
            for k, v in state.items()
        }
    state["score.weight"] = 0.2 * torch.randn(1, config.hidden_size, generator=torch.Generator().manual_seed(5))
    model.load_state_dict(state)
    model.save_pretrained(out, safe_serialization=True)


@pytest.fixture(scope="module")
def ppo_assets(tiny_assets, tmp_path_factory):
    """tokenizer.model and llama/ of the tiny assets, a reward model rm/, and prompts.json."""
    root = tmp_path_factory.mktemp("ppo_assets")
    (root / "tokenizer.model").symlink_to(tiny_assets / "tokenizer.model")
    (root / "llama").symlink_to(tiny_assets / "llama")
    _save_reward_model(tiny_assets / "llama", root / "rm", last_token_only=False)
    _write_prompts(root / "prompts.json", 16)
    return root


def _overrides(assets: Path, out: Path, *extra: str) -> list[str]:
    return [f"assets_dir={assets}", f"output_dir={out}", f"dataset.data_files={assets / 'prompts.json'}", *extra]


def _load_recipe_module():
    spec = importlib.util.spec_from_file_location("ppo_recipe_under_test", ROOT / "recipes" / f"{RECIPE}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _reference_step(assets: Path, trajectory, lr: float, kl_coeff: float, temperature: float, loss_cfg: dict):
    """The first PPO step from the equations, with the Hugging Face models: returns the loss parts and the models
    after one SGD step."""
    from transformers import LlamaForCausalLM, LlamaForSequenceClassification

    policy = LlamaForCausalLM.from_pretrained(assets / "llama", dtype=torch.float32, attn_implementation="eager")
    reference = LlamaForCausalLM.from_pretrained(assets / "llama", dtype=torch.float32, attn_implementation="eager")
    value_model = LlamaForSequenceClassification.from_pretrained(
        assets / "rm", dtype=torch.float32, attn_implementation="eager"
    )
    reward_model = LlamaForSequenceClassification.from_pretrained(
        assets / "rm", dtype=torch.float32, attn_implementation="eager"
    )
    tokens = trajectory.query_responses
    response_pad = trajectory.response_padding_masks
    batch, response_len = response_pad.shape
    prompt_len = tokens.shape[1] - response_len
    # left-padded prompts: attention skips the leading pads, positions count from each row's first real token
    real = torch.cat([(tokens[:, :prompt_len] != PAD).cumsum(-1) > 0, torch.ones_like(response_pad)], dim=1)
    position_ids = (real.long().cumsum(-1) - 1).clamp(min=0)
    hf_inputs = dict(input_ids=tokens, attention_mask=real.long(), position_ids=position_ids)
    lengths = (~response_pad).sum(-1).tolist()
    responses = tokens[:, prompt_len:]

    def logprobs(model):
        logits = model(**hf_inputs).logits[:, prompt_len - 1 : -1] / temperature
        return F.log_softmax(logits, dim=-1).gather(-1, responses[..., None])[..., 0]

    def per_position(model):
        return model.score(model.model(**hf_inputs).last_hidden_state)[..., 0]

    with torch.no_grad():
        old_logprobs, ref_logprobs = logprobs(policy), logprobs(reference)
        old_values = per_position(value_model)[:, prompt_len - 1 : -1]
        scores = per_position(reward_model)[torch.arange(batch), torch.tensor(lengths) + prompt_len - 1]
    # rewards, GAE and returns, token by token (gamma 1, lambda 0.95 as in ppo_tiny.yaml)
    gamma, lmbda = 1.0, 0.95
    advantages, returns = torch.zeros(batch, response_len), torch.zeros(batch, response_len)
    for i, length in enumerate(lengths):
        rewards = [-kl_coeff * (old_logprobs[i, t] - ref_logprobs[i, t]).item() for t in range(length)]
        rewards[-1] += scores[i].item()
        values = [*old_values[i, :length].tolist(), 0.0]  # the response's end is terminal
        deltas = [rewards[t] + gamma * values[t + 1] - values[t] for t in range(length)]
        for t in range(length):
            advantages[i, t] = sum((gamma * lmbda) ** k * deltas[t + k] for k in range(length - t))
            returns[i, t] = advantages[i, t] + values[t]
    kept = ~response_pad
    mean, var = advantages[kept].mean(), advantages[kept].var()
    advantages = torch.where(kept, (advantages - mean) / torch.sqrt(var + 1e-8) + mean, 0.0)

    new_logprobs, new_values = logprobs(policy), per_position(value_model)[:, prompt_len - 1 : -1]
    ratio = torch.exp(new_logprobs - old_logprobs)
    eps, clip_v = loss_cfg["epsilon"], loss_cfg["value_clip_range"]
    surrogate = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(1 - eps, 1 + eps))
    clipped_values = torch.minimum(torch.maximum(new_values, old_values - clip_v), old_values + clip_v)
    value_errors = torch.maximum((new_values - returns) ** 2, (clipped_values - returns) ** 2)
    policy_loss = surrogate[kept].mean()  # a mean over every response token of the minibatch
    value_loss = 0.5 * value_errors[kept].mean()
    loss = policy_loss + loss_cfg["value_coeff"] * value_loss
    loss.backward()
    with torch.no_grad():
        for model in (policy, value_model):
            for param in model.parameters():
                param -= lr * param.grad
    parts = {
        "loss": loss.item(),
        "policy_loss": policy_loss.item(),
        "value_loss": value_loss.item(),
        "scores": scores.mean().item(),
    }
    return parts, policy, value_model, (old_logprobs, ref_logprobs, old_values, scores)


def test_first_step_equals_plain_pytorch(ppo_assets, tmp_path, monkeypatch):
    from tune import config

    lr, kl_coeff = 0.5, 0.05
    overrides = _overrides(
        ppo_assets,
        tmp_path / "run",
        "num_steps=4",
        "ppo_epochs=1",
        "ppo_batch_size=4",
        "gradient_accumulation_steps=2",
        "optimizer._component_=torch.optim.SGD",
        f"optimizer.lr={lr}",
        "~optimizer.foreach",
        f"kl_coeff={kl_coeff}",
        "temperature=0.9",
        "max_generated_tokens=8",
    )
    cfg = config.load_config(CONFIG, overrides)
    config.apply_defaults(cfg, ["finetune"])
    module = _load_recipe_module()
    recipe = module.PPOFullFinetuneRecipeSingleDevice(cfg)
    recipe.setup(cfg)
    captured = []
    generate = recipe.generate_trajectory_batched
    monkeypatch.setattr(
        recipe, "generate_trajectory_batched", lambda ids: captured.append(generate(ids)) or captured[-1]
    )
    recipe.train()
    recipe.cleanup()
    (trajectory,) = captured
    assert trajectory.query_responses.shape[0] == 4 and (~trajectory.response_padding_masks).sum() > 8

    loss_cfg = {
        "epsilon": cfg.loss.epsilon,
        "value_clip_range": cfg.loss.value_clip_range,
        "value_coeff": cfg.loss.value_coeff,
    }
    expected, policy, value_model, (old_lp, ref_lp, old_values, scores) = _reference_step(
        ppo_assets, trajectory, lr, kl_coeff, 0.9, loss_cfg
    )
    kept = ~trajectory.response_padding_masks
    torch.testing.assert_close(trajectory.logprobs[kept], old_lp[kept], atol=1e-5, rtol=0)
    torch.testing.assert_close(trajectory.ref_logprobs[kept], ref_lp[kept], atol=1e-5, rtol=0)
    torch.testing.assert_close(trajectory.values[kept], old_values[kept], atol=1e-5, rtol=0)
    torch.testing.assert_close(trajectory.scores, scores, atol=1e-5, rtol=0)
    (record,) = [r for r in read_jsonl(tmp_path / "run" / "logs" / "log.jsonl") if "loss" in r]
    print({key: (record[key], value, abs(record[key] - value)) for key, value in expected.items()})
    for key, value in expected.items():
        assert record[key] == pytest.approx(value, abs=1e-5), key
    assert record["ratios"] == pytest.approx(1.0, abs=1e-6) and record["clipfrac"] == 0.0
    # the weights after the SGD step: the recipe's outputs (Hugging Face keys) against the reference models
    saved_policy = load_file(tmp_path / "run" / "step_1" / "model.safetensors")
    saved_value = load_file(tmp_path / "run" / "value" / "step_1" / "model.safetensors")
    original = load_file(ppo_assets / "llama" / "model.safetensors")
    assert max((original[k] - v).abs().max().item() for k, v in saved_policy.items()) > 1e-3  # the step moved them
    for saved, model in ((saved_policy, policy), (saved_value, value_model)):
        reference_state = model.state_dict()
        assert saved.keys() == reference_state.keys()
        apart = max((reference_state[k] - v).abs().max().item() for k, v in saved.items())
        print(f"weights after the step: max difference {apart:.2e}")
        assert apart < 1e-5
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


@pytest.fixture(scope="module")
def two_step_run(ppo_assets, tmp_path_factory):
    """Two PPO steps with checkpoints after each, run in this process (the resumed run is a fresh process)."""
    out = tmp_path_factory.mktemp("ppo_run") / "run"
    _load_recipe_module().recipe_main(["--config", str(CONFIG), *_overrides(ppo_assets, out, "save_every_n_steps=1")])
    return out


def _metrics(out: Path) -> dict[int, dict]:
    return {r["step"]: r for r in read_jsonl(out / "logs" / "log.jsonl") if "loss" in r}


def test_resume_equals_uninterrupted_run(ppo_assets, two_step_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(two_step_run, out, symlinks=True)
    shutil.rmtree(out / "step_2")
    shutil.rmtree(out / "value" / "step_2")
    (out / "logs" / "log.jsonl").unlink()
    run_recipe(
        RECIPE, CONFIG, _overrides(ppo_assets, out, "save_every_n_steps=1", "resume_from_checkpoint=True"), cwd=tmp_path
    )
    resumed, full = _metrics(out), _metrics(two_step_run)
    assert sorted(resumed) == [2]
    for key in (
        "loss",
        "policy_loss",
        "value_loss",
        "scores",
        "kl",
        "response_lengths",
        "clipfrac",
        "approx_policy_kl",
    ):
        assert resumed[2][key] == pytest.approx(full[2][key], abs=1e-6), key
    for sub in ("step_2", "value/step_2"):
        a, b = load_file(out / sub / "model.safetensors"), load_file(two_step_run / sub / "model.safetensors")
        assert all(torch.equal(a[k], b[k]) for k in a), sub


def test_outputs_load_in_transformers_and_log_torchtune_metrics(two_step_run):
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    policy = AutoModelForCausalLM.from_pretrained(two_step_run / "step_2")
    value = AutoModelForSequenceClassification.from_pretrained(two_step_run / "value" / "step_2")
    assert value.config.num_labels == 1 and value.score.weight.shape == (1, policy.config.hidden_size)
    record = _metrics(two_step_run)[2]
    expected = {
        "loss", "policy_loss", "value_loss", "ratios", "clipfrac", "approx_policy_kl", "scores", "rlhf_reward", "kl",
        "kl_reward", "response_lengths", "num_stop_tokens", "lr", "tokens_per_second", "grad_norm",
    }  # fmt: skip
    assert expected <= record.keys()
    assert 1 <= record["response_lengths"] <= 6


@pytest.mark.slow
def test_ppo_raises_the_reward(tiny_assets, tmp_path):
    """A reward that reads the response's last token only: PPO moves the policy towards high-scoring endings."""
    assets = tmp_path / "assets"
    assets.mkdir()
    (assets / "tokenizer.model").symlink_to(tiny_assets / "tokenizer.model")
    (assets / "llama").symlink_to(tiny_assets / "llama")
    _save_reward_model(tiny_assets / "llama", assets / "rm", last_token_only=True)
    _write_prompts(assets / "prompts.json", 64)
    out = tmp_path / "run"
    extra = [
        "batch_size=16", "forward_batch_size=16", "ppo_batch_size=8", "num_steps=320", "ppo_epochs=4",
        "max_generated_tokens=3", "optimizer.lr=3e-3", "kl_coeff=0.0", "stop_token_ids=[2]",
    ]  # fmt: skip
    run_recipe(RECIPE, CONFIG, _overrides(assets, out, *extra), cwd=tmp_path, timeout=600)
    scores = [r["scores"] for _, r in sorted(_metrics(out).items())]
    first, last = sum(scores[:3]) / 3, sum(scores[-3:]) / 3
    print(f"PPO learning: mean score of the first 3 steps {first:.3f}, of the last 3 {last:.3f} ({len(scores)} steps)")
    assert last > first + 0.5


def test_inconsistent_batch_sizes_are_reported_together(ppo_assets, tmp_path):
    from tune import config

    overrides = ["ppo_batch_size=3", "forward_batch_size=3", "gradient_accumulation_steps=2", "temperature=0"]
    cfg = config.load_config(CONFIG, _overrides(ppo_assets, tmp_path, *overrides))
    config.apply_defaults(cfg, ["finetune"])
    with pytest.raises(config.ConfigError) as info:
        _load_recipe_module().PPOFullFinetuneRecipeSingleDevice(cfg)
    message = str(info.value)
    for key in ("forward_batch_size", "ppo_batch_size", "gradient_accumulation_steps", "temperature"):
        assert key in message


@pytest.mark.slow
def test_memory_options_run_and_resume(ppo_assets, tmp_path):
    """optimizer_in_bwd, activation checkpointing and bf16 together: the run finishes, saves and resumes."""
    out = tmp_path / "run"
    extra = ["optimizer_in_bwd=True", "enable_activation_checkpointing=True", "dtype=bf16", "save_every_n_steps=1"]
    run_recipe(RECIPE, CONFIG, _overrides(ppo_assets, out, *extra), cwd=tmp_path)
    full = _metrics(out)
    assert sorted(full) == [1, 2] and all(math.isfinite(r["loss"]) for r in full.values())
    shutil.rmtree(out / "step_2")
    shutil.rmtree(out / "value" / "step_2")
    (out / "logs" / "log.jsonl").unlink()
    run_recipe(RECIPE, CONFIG, _overrides(ppo_assets, out, *extra, "resume_from_checkpoint=True"), cwd=tmp_path)
    assert _metrics(out)[2]["loss"] == pytest.approx(full[2]["loss"], abs=1e-6)
