"""Generate text with a model, optionally with a LoRA adapter applied on the fly (never merged).

The prompt comes from the config or the command line: a plain ``prompt.user`` (and optional ``prompt.system``),
or a whole conversation in ``messages``. With a LoRA model builder in ``model`` and the adapter named in the
checkpointer (``adapter_checkpoint``, our own or a Hugging Face PEFT ``adapter_model.safetensors``), the base
weights and the adapter are loaded side by side and the adapter runs unmerged.

A vision-language model takes images in the prompt, with its model transform as ``tokenizer``: torchtune's
``prompt.user: {image: PATH_OR_URL, text: ...}``, or image parts in ``messages``
(``content: [{type: image, content: PATH_OR_URL}, {type: text, content: ...}]``).

    tune run generate --config generation prompt.user="Tell me a joke."
    tune run generate --config generation temperature=0 max_new_tokens=64
    tune run generate --config qwen2_5_vl/3B_generation prompt.user.image=cat.png prompt.user.text="What is it?"
"""

import sys
import time
from typing import Any

import torch
from omegaconf import DictConfig, ListConfig, OmegaConf

from tune import config, training, utils
from tune.data import Message, load_image, padded_collate_images, padded_collate_tiled_images_and_mask
from tune.generation import generate
from tune.modules.peft import get_adapter_params, validate_lora_state_dict_load

RECIPE_INFO = {
    "supports_distributed": False,
    "configs": ["generation", "*/generation", "*/*_generation", "*/*_generation_v2"],
}

log = utils.get_logger(name="tune.recipes.generate")


class InferenceRecipe:
    """Loads a model (and adapter), turns the configured prompt into tokens, generates and prints the text.

    Args:
        cfg (DictConfig): the generation config (see ``configs/generation.yaml``).

    Raises:
        tune.config.ConfigError: for a config with neither ``prompt`` nor ``messages``, or a quantizer.
    """

    def __init__(self, cfg: DictConfig) -> None:
        self._device = utils.get_device(cfg.device)
        self._dtype = utils.get_dtype(cfg.dtype, device=self._device)
        self._seed = training.set_seed(cfg.seed)
        self._max_new_tokens = cfg.max_new_tokens
        self._temperature = cfg.temperature
        self._top_k = cfg.top_k
        self._top_p = cfg.get("top_p", None)  # ours: torchtune configs have no nucleus sampling
        self._enable_kv_cache = cfg.get("enable_kv_cache", True)
        if cfg.get("quantizer", None) is not None:
            raise config.ConfigError(
                config.ConfigProblem(
                    "quantizer",
                    "is not supported by this recipe; set quantizer=null (quantise with recipes/quantize.py)",
                )
            )

    def load_checkpoint(self, cfg_checkpointer: DictConfig) -> dict[str, Any]:
        """Reads the model weights, and the adapter when the checkpointer names one.

        Args:
            cfg_checkpointer (DictConfig): the ``checkpointer`` section.

        Returns:
            dict[str, Any]: the model state under ``training.MODEL_KEY``, the adapter under ``training.ADAPTER_KEY``.
        """
        checkpointer = config.instantiate(cfg_checkpointer)
        return checkpointer.load_checkpoint()

    def setup(self, cfg: DictConfig) -> None:
        """Builds the model from the checkpoint and the tokenizer."""
        ckpt = self.load_checkpoint(cfg.checkpointer)
        with training.set_default_dtype(self._dtype), self._device:
            model = config.instantiate(cfg.model)
        if get_adapter_params(model):
            # base weights first (adapter keys missing), then the adapter on top, kept unmerged
            adapter = ckpt.get(training.ADAPTER_KEY)
            if adapter is None:
                raise config.ConfigError(
                    config.ConfigProblem(
                        "checkpointer.adapter_checkpoint",
                        f"is not set, but model._component_={cfg.model._component_} builds LoRA layers: name the "
                        "adapter (a PEFT directory or adapter_model.safetensors, ours or Hugging Face's), or use the "
                        "base builder",
                    )
                )
            missing, unexpected = model.load_state_dict(ckpt[training.MODEL_KEY], strict=False)
            validate_lora_state_dict_load(model, missing, unexpected, loaded="base")
            missing, unexpected = model.load_state_dict(adapter, strict=False)
            validate_lora_state_dict_load(model, missing, unexpected, loaded="adapter")
            log.info("Loaded the base model and a LoRA adapter (%d tensors), unmerged.", len(adapter))
        else:
            model.load_state_dict(ckpt[training.MODEL_KEY])
        self._model = model.eval()
        self._tokenizer = config.instantiate(cfg.tokenizer)
        self._messages = self._prompt_messages(cfg)
        self._has_images = any(m.contains_media for m in self._messages)
        if self._has_images and not _takes_images(self._tokenizer):
            raise config.ConfigError(
                config.ConfigProblem(
                    "tokenizer._component_",
                    f"is {cfg.tokenizer._component_}, a text tokenizer, but the prompt holds an image: use a "
                    "vision-language model and its model transform (e.g. tune.models.qwen2_5_vl.qwen2_5_vl_transform), "
                    "or drop the image",
                )
            )

    def _prompt_messages(self, cfg: DictConfig) -> list[Message]:
        messages_cfg = cfg.get("messages", None)  # ours: a whole conversation instead of prompt.system/user
        prompt_cfg = cfg.get("prompt", None)
        if messages_cfg is not None:
            items = OmegaConf.to_container(messages_cfg, resolve=True)
            if not isinstance(messages_cfg, ListConfig) or not items:
                raise config.ConfigError(
                    config.ConfigProblem(
                        "messages",
                        "must be a non-empty list of {role, content}, e.g. '[{role: user, content: Hi}]'",
                        items,
                    )
                )
            return [Message(role=m["role"], content=_load_images(m["content"])) for m in items]
        if isinstance(prompt_cfg, str):
            return [Message(role="user", content=prompt_cfg)]
        if isinstance(prompt_cfg, DictConfig) and prompt_cfg.get("user") is not None:
            system = prompt_cfg.get("system", None)
            head = [Message(role="system", content=system)] if system else []
            user = prompt_cfg.user
            if isinstance(user, DictConfig):  # torchtune's {image: PATH_OR_URL, text: ...}: the image first
                unknown = sorted(set(user) - {"image", "text"})
                if unknown or user.get("text") is None:
                    raise config.ConfigError(
                        config.ConfigProblem(
                            "prompt.user", "takes text, or {image: PATH_OR_URL, text: ...} with text set", user
                        )
                    )
                parts = [{"type": "text", "content": user.text}]
                if user.get("image") is not None:
                    parts.insert(0, {"type": "image", "content": user.image})
                return head + [Message(role="user", content=_load_images(parts))]
            return head + [Message(role="user", content=user)]
        raise config.ConfigError(
            config.ConfigProblem(
                "prompt",
                'has nothing to generate from: set prompt.user="Tell me a joke.", or messages to a conversation',
            )
        )

    @torch.inference_mode()
    def generate(self) -> str:
        """Generates the continuation of the configured prompt, logs speed and returns the text."""
        prompt, images = self._prompt_batch()
        tokens = prompt[0].tolist()
        rng = torch.Generator(device=self._device).manual_seed(self._seed)
        start = time.perf_counter()
        generated, _ = generate(
            self._model,
            prompt,
            max_generated_tokens=self._max_new_tokens,
            pad_id=self._tokenizer.pad_id,
            temperature=self._temperature,
            top_k=self._top_k,
            top_p=self._top_p,
            stop_tokens=self._tokenizer.stop_tokens,
            rng=rng,
            return_logits=False,
            use_cache=self._enable_kv_cache,
            **images,
        )
        generated = generated[0, len(tokens) :].tolist()  # the prompt comes first
        elapsed = time.perf_counter() - start
        # drop what follows a stop token; keep the text before it
        stops = [i for i, t in enumerate(generated) if t in set(self._tokenizer.stop_tokens)]
        text = self._tokenizer.decode(generated[: stops[0]] if stops else generated)
        print(text, flush=True)
        log.info("Generated %d tokens in %.2f s (%.1f tokens/s).", len(generated), elapsed, len(generated) / elapsed)
        return text

    def _prompt_batch(self) -> tuple[torch.Tensor, dict[str, Any]]:
        """The prompt as a batch of one [1, s] (an open assistant turn), and ``generate``'s image arguments."""
        if not self._has_images:
            tokens, _ = self._tokenizer.tokenize_messages(self._messages, add_end_tokens=False)
            return torch.tensor([tokens], dtype=torch.long, device=self._device), {}
        sample = self._tokenizer({"messages": self._messages}, inference=True)
        if "encoder_mask" in sample:  # cross-attention (Llama 3.2 Vision): tiled images and their masks
            batch = padded_collate_tiled_images_and_mask([sample], self._tokenizer.pad_id, pad_direction="left")
        else:  # the image vectors take the image tokens' places (Qwen2.5-VL, Gemma 3); no labels to train
            sample = {**sample, "labels": sample["tokens"]}
            batch = padded_collate_images([sample], self._tokenizer.pad_id)
        images = {key: batch[key] for key in ("encoder_input", "encoder_mask") if batch.get(key) is not None}
        if "encoder_input" in images:  # pixels in the model's dtype
            images["encoder_input"] = {
                key: value.to(self._dtype) if value.is_floating_point() else value
                for key, value in images["encoder_input"].items()
            }
        return batch["tokens"].to(self._device), training.batch_to_device(images, self._device)


def _takes_images(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` is a vision-language model transform: called on a sample, it gives ``encoder_input``."""
    if not callable(tokenizer):
        return False
    return "encoder_input" in tokenizer({"messages": [Message(role="user", content="Hi")]}, inference=True)


def _load_images(content: Any) -> Any:
    """Message content with every image part's path or URL loaded (``tune.data.load_image``)."""
    if isinstance(content, str):
        return content
    return [
        {**part, "content": load_image(part["content"])} if part.get("type") == "image" else part for part in content
    ]


@config.parse
def recipe_main(cfg: DictConfig) -> None:
    """Entry point: ``tune run generate --config CONFIG [key=value ...]``."""
    config.log_config(recipe_name="InferenceRecipe", cfg=cfg)
    recipe = InferenceRecipe(cfg)
    recipe.setup(cfg)
    recipe.generate()


if __name__ == "__main__":
    sys.exit(recipe_main())
