"""Evaluate a model with EleutherAI's lm-evaluation-harness (``lm-eval`` 0.4.x) on any of its tasks.

The model is built and loaded like in the training recipes (a LoRA adapter is applied unmerged when the model
builder and checkpointer name one) and wrapped as an ``lm_eval`` language model: log-likelihood scoring for
multiple-choice and perplexity tasks, and generation (with the KV cache) for ``generate_until`` tasks. Tasks are
the harness's own names, or your task YAML files in the directory given by ``include_path``.

A vision-language model (its model transform as ``tokenizer``) also runs the harness's tasks with images, such as
``mmmu_val_science``, scored by generation: each question becomes a user turn holding its images where the task's
``<image>`` placeholders are.

    pip install 'tune[eval]'
    tune run eleuther_eval --config eleuther_evaluation tasks='[hellaswag]' limit=100
    tune run eleuther_eval --config eleuther_evaluation tasks='[my_task]' include_path=my_tasks/
    tune run eleuther_eval --config llama3_2_vision/11B_evaluation
"""

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from tune import config, training, utils
from tune.data import (
    Message,
    format_content_with_images,
    load_image,
    padded_collate_images,
    padded_collate_tiled_images_and_mask,
)
from tune.generation import generate
from tune.modules.peft import get_adapter_params, validate_lora_state_dict_load

# lm-eval is an optional dependency: fail here, with the install command, rather than halfway through a run
utils.import_optional("lm_eval", "the eleuther_eval recipe")
from lm_eval.api.model import TemplateLM  # noqa: E402
from lm_eval.evaluator import evaluate  # noqa: E402
from lm_eval.tasks import TaskManager, get_task_dict  # noqa: E402
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window, make_table  # noqa: E402

RECIPE_INFO = {"supports_distributed": False, "configs": ["eleuther_evaluation", "*/evaluation", "*/*_evaluation"]}

log = utils.get_logger(name="tune.recipes.eleuther_eval")

# where an image goes in the text of lm-eval's tasks with images (mmmu_val_* write "<image 1>" as it)
IMAGE_PLACEHOLDER = "<image>"
_NOT_SCORED = (
    "a task with images, which eleuther_eval scores by generation only (output_type: generate_until, as mmmu_val_* "
    "are), not by log-likelihood (multiple_choice, loglikelihood); lm-eval's own hf-multimodal model does not "
    "either: choose generate_until tasks"
)


class TuneLM(TemplateLM):
    """A tune model and tokenizer seen by ``lm_eval`` as a causal language model.

    Args:
        model (torch.nn.Module): a decoder returning logits ``[b, s, vocab]`` (``skip_output_layer`` off).
        tokenizer (Any): the model's tokenizer (``encode``, ``decode``, ``bos_id``, ``eos_id``, ``pad_id``,
            ``stop_tokens``).
        max_seq_length (int): longest input; longer contexts keep their last tokens.
        batch_size (int): sequences per forward pass.
        enable_kv_cache (bool): use the KV cache when generating.
    """

    def __init__(
        self, model: torch.nn.Module, tokenizer: Any, max_seq_length: int, batch_size: int, enable_kv_cache: bool
    ) -> None:
        super().__init__()
        self._model, self._tokenizer = model, tokenizer
        self._max_seq_length, self._batch_size, self._enable_kv_cache = max_seq_length, batch_size, enable_kv_cache
        self._device = next(model.parameters()).device

    @property
    def eot_token_id(self) -> int:
        return self._tokenizer.eos_id

    @property
    def prefix_token_id(self) -> int:
        # an empty context is conditioned on BOS, as the model saw at the start of every training sample
        return self._tokenizer.bos_id

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        return self._tokenizer.encode(string, add_bos=add_special_tokens is not False, add_eos=False)

    def tok_decode(self, tokens: list[int]) -> str:
        return self._tokenizer.decode(tokens)

    @torch.inference_mode()
    def _loglikelihood_tokens(
        self, requests: list, disable_tqdm: bool = False, **kwargs: Any
    ) -> list[tuple[float, bool]]:
        """Scores each ``(key, context_tokens, continuation_tokens)``: sum of log-probs and whether greedy."""
        results = []
        for start in range(0, len(requests), self._batch_size):
            chunk = requests[start : start + self._batch_size]
            # the model reads context + continuation minus the last token; position i predicts token i + 1
            inputs = [(ctx + cont)[-(self._max_seq_length + 1) :][:-1] for _, ctx, cont in chunk]
            length = max(len(x) for x in inputs)
            tokens = torch.full((len(inputs), length), self._tokenizer.pad_id, dtype=torch.long)
            for row, x in enumerate(inputs):
                tokens[row, : len(x)] = torch.tensor(x)  # right padding: causal attention never sees it
            logits = self._model(tokens.to(self._device))  # [b, s, vocab]
            for row, (_, _, cont) in enumerate(chunk):
                n = len(inputs[row])
                cont_logits = logits[row, n - len(cont) : n].float().log_softmax(dim=-1)  # [len(cont), vocab]
                target = torch.tensor(cont, device=cont_logits.device)
                logprob = cont_logits.gather(1, target[:, None]).sum().item()
                is_greedy = bool((cont_logits.argmax(dim=-1) == target).all())
                results.append((logprob, is_greedy))
        return results

    def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list[float]:
        """Log-likelihood of whole documents, scored in windows of ``max_seq_length`` tokens."""
        results = []
        for request in requests:
            (text,) = request.args
            windows = get_rolling_token_windows(
                token_list=self.tok_encode(text, add_special_tokens=False),
                prefix_token=self.prefix_token_id,
                max_seq_len=self._max_seq_length,
                context_len=1,
            )
            pairs = [(None, ctx, cont) for ctx, cont in map(make_disjoint_window, windows)]
            results.append(sum(logprob for logprob, _ in self._loglikelihood_tokens(pairs)))
        return results

    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        """Generates after each context until one of its ``until`` strings or ``max_gen_toks`` tokens."""
        outputs = []
        for request in requests:
            context, gen_kwargs = request.args
            until = gen_kwargs.get("until", [])
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(gen_kwargs.get("max_gen_toks", 256))
            temperature = float(gen_kwargs.get("temperature", 0.0)) if gen_kwargs.get("do_sample", False) else 0.0
            prompt = self.tok_encode(context)[-(self._max_seq_length - max_new) :]
            tokens, _ = generate(
                self._model,
                torch.tensor(prompt, dtype=torch.long, device=self._device),
                max_generated_tokens=max_new,
                pad_id=self._tokenizer.pad_id,
                temperature=temperature,
                stop_tokens=self._tokenizer.stop_tokens,
                use_cache=self._enable_kv_cache,
                return_logits=False,
            )
            new_tokens = tokens[0, len(prompt) :].tolist()  # the prompt comes first
            stops = [i for i, t in enumerate(new_tokens) if t in set(self._tokenizer.stop_tokens)]
            text = self.tok_decode(new_tokens[: stops[0]] if stops else new_tokens)
            for stop in until:  # cut at the first stop string, as the harness expects
                text = text.split(stop)[0] if stop else text
            outputs.append(text)
        return outputs


class TuneVisionLM(TuneLM):
    """A tune vision-language model and its model transform seen by ``lm_eval`` as a multimodal model, as its own
    ``hf-multimodal`` is: tasks with images (``doc_to_image``, such as ``mmmu_val_*``) run on it.

    A ``generate_until`` request with images carries the context text, which holds lm-eval's placeholder
    ``<image>`` where each image goes, and the images. The context becomes one user message with the images in
    place of the placeholders (or ahead of the text when it holds none), the transform builds the prompt with the
    assistant turn open (its chat format, as the model was fine-tuned), and the model generates from it with its
    images, one request at a time. Requests without images are served as :class:`TuneLM` serves them.

    Args:
        model (torch.nn.Module): a vision-language model taking ``encoder_input`` (and ``encoder_mask``).
        transform (Any): its model transform (``tokenizer`` in the config): called on ``{"messages": [...]}``
            with ``inference=True`` it returns ``tokens`` and ``encoder_input`` (and ``encoder_mask``).
        max_seq_length (int): longest input, prompt and generated tokens together.
        batch_size (int): sequences per forward pass of requests without images.
        enable_kv_cache (bool): use the KV cache when generating.
        dtype (torch.dtype): the model's dtype, which the pixels are cast to.
    """

    MULTIMODAL = True  # lm-eval runs a task with images only on a model that says it takes them

    def __init__(
        self,
        model: torch.nn.Module,
        transform: Any,
        max_seq_length: int,
        batch_size: int,
        enable_kv_cache: bool,
        dtype: torch.dtype,
    ) -> None:
        super().__init__(model, transform, max_seq_length, batch_size, enable_kv_cache)
        self._dtype = dtype

    def loglikelihood(self, requests: list, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        if any(len(request.args) > 2 for request in requests):
            raise utils.TuneError(_NOT_SCORED)
        return super().loglikelihood(requests, disable_tqdm=disable_tqdm)

    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        """Generates after each context (with its images) until one of its ``until`` strings or ``max_gen_toks``
        tokens."""
        outputs = []
        for request in requests:
            if len(request.args) < 3:  # no images: a text task evaluated on the same model
                outputs.extend(super().generate_until([request], disable_tqdm=True))
                continue
            context, gen_kwargs, media = request.args
            until = gen_kwargs.get("until", [])
            until = [until] if isinstance(until, str) else list(until)
            temperature = float(gen_kwargs.get("temperature", 0.0)) if gen_kwargs.get("do_sample", False) else 0.0
            prompt, images = self._prompt_batch(context, media.get("visual"))
            # image tokens cannot be cut off the front as text can: a long prompt leaves fewer tokens to generate
            max_new = min(int(gen_kwargs.get("max_gen_toks", 256)), self._max_seq_length - prompt.shape[1])
            if max_new < 1:
                raise utils.TuneError(
                    f"a prompt with images is {prompt.shape[1]} tokens, but max_seq_length is "
                    f"{self._max_seq_length}: raise max_seq_length (and tokenizer.max_seq_len) to evaluate it"
                )
            tokens, _ = generate(
                self._model,
                prompt,
                max_generated_tokens=max_new,
                pad_id=self._tokenizer.pad_id,
                temperature=temperature,
                stop_tokens=self._tokenizer.stop_tokens,
                use_cache=self._enable_kv_cache,
                return_logits=False,
                **images,
            )
            new_tokens = tokens[0, prompt.shape[1] :].tolist()  # the prompt comes first
            stops = [i for i, t in enumerate(new_tokens) if t in set(self._tokenizer.stop_tokens)]
            text = self.tok_decode(new_tokens[: stops[0]] if stops else new_tokens)
            for stop in until:  # cut at the first stop string, as the harness expects
                text = text.split(stop)[0] if stop else text
            outputs.append(text)
        return outputs

    def _prompt_batch(self, context: str, visual: Any) -> tuple[torch.Tensor, dict[str, Any]]:
        """The prompt [1, s] of one request (a user turn, the assistant turn open) and ``generate``'s image
        arguments, collated in the family's layout."""
        if visual is None:
            visual = []
        images = [load_image(image) for image in (visual if isinstance(visual, (list, tuple)) else [visual])]
        if IMAGE_PLACEHOLDER in context:
            try:
                content = format_content_with_images(context, image_tag=IMAGE_PLACEHOLDER, images=images)
            except ValueError as err:
                raise utils.TuneError(f"a request of a task with images does not fit its images: {err}") from err
        else:  # a task whose text names no place for its images: they come first, as most models were taught
            content = [*({"type": "image", "content": image} for image in images), {"type": "text", "content": context}]
        sample = self._tokenizer({"messages": [Message(role="user", content=content)]}, inference=True)
        if "encoder_mask" in sample:  # cross-attention (Llama 3.2 Vision): tiled images and their masks
            batch = padded_collate_tiled_images_and_mask([sample], self._tokenizer.pad_id, pad_direction="left")
        else:  # the image vectors take the image tokens' places (Qwen2.5-VL, Gemma 3); no labels to train
            batch = padded_collate_images([{**sample, "labels": sample["tokens"]}], self._tokenizer.pad_id)
        images = {key: batch[key] for key in ("encoder_input", "encoder_mask") if batch.get(key) is not None}
        if "encoder_input" in images:  # pixels in the model's dtype
            images["encoder_input"] = {
                key: value.to(self._dtype) if value.is_floating_point() else value
                for key, value in images["encoder_input"].items()
            }
        return batch["tokens"].to(self._device), training.batch_to_device(images, self._device)


class EleutherEvalRecipe:
    """Builds the model and tokenizer from the config and runs the configured ``lm_eval`` tasks.

    Args:
        cfg (DictConfig): the evaluation config (see ``configs/eleuther_evaluation.yaml``).
    """

    def __init__(self, cfg: DictConfig) -> None:
        self._device = utils.get_device(cfg.device)
        self._dtype = utils.get_dtype(cfg.dtype, device=self._device)
        self._seed = training.set_seed(cfg.seed)
        self._output_dir = Path(cfg.output_dir)
        self._tasks = list(cfg.tasks)
        self._limit = cfg.limit
        self._max_seq_length = cfg.max_seq_length
        self._batch_size = cfg.batch_size
        self._enable_kv_cache = cfg.get("enable_kv_cache", True)
        self._include_path = cfg.get("include_path", None)  # ours: a directory of the user's task YAML files
        if cfg.get("quantizer", None) is not None:
            raise config.ConfigError(config.ConfigProblem("quantizer", "is not supported by eleuther_eval; set null"))

    def load_checkpoint(self, cfg_checkpointer: DictConfig) -> dict[str, Any]:
        """Reads the model weights (and adapter, when the checkpointer names one)."""
        return config.instantiate(cfg_checkpointer).load_checkpoint()

    def setup(self, cfg: DictConfig) -> None:
        """Builds the model with its weights (adapter unmerged) and the tokenizer."""
        self._tokenizer = config.instantiate(cfg.tokenizer)
        # a vision-language model's transform (called on a sample it gives encoder_input): the model reads images
        self._takes_images = callable(self._tokenizer) and "encoder_input" in self._tokenizer(
            {"messages": [Message(role="user", content="Hi")]}, inference=True
        )
        # the tasks are read before the weights, so that a text model given tasks with images fails at once
        self._task_dict = get_task_dict(self._tasks, TaskManager(include_path=self._include_path))
        with_images = _tasks_with_images(self._task_dict)  # name -> output_type
        if with_images and not self._takes_images:
            raise config.ConfigError(
                config.ConfigProblem(
                    "tasks",
                    f"holds {', '.join(with_images)}, with images, but tokenizer._component_="
                    f"{cfg.tokenizer._component_} is a text tokenizer: evaluate a vision-language model with its "
                    "model transform as tokenizer (configs/llama3_2_vision/11B_evaluation.yaml), or choose text tasks",
                )
            )
        scored = [name for name, output_type in with_images.items() if output_type != "generate_until"]
        if scored:
            raise config.ConfigError(config.ConfigProblem("tasks", f"holds {', '.join(scored)}: {_NOT_SCORED}"))
        ckpt = self.load_checkpoint(cfg.checkpointer)
        with training.set_default_dtype(self._dtype), self._device:
            model = config.instantiate(cfg.model)
        if get_adapter_params(model):
            if training.ADAPTER_KEY not in ckpt:
                raise config.ConfigError(
                    config.ConfigProblem(
                        "checkpointer.adapter_checkpoint",
                        f"is not set, but model._component_={cfg.model._component_} builds LoRA layers: name the "
                        "adapter, or use the base model builder",
                    )
                )
            missing, unexpected = model.load_state_dict(ckpt[training.MODEL_KEY], strict=False)
            validate_lora_state_dict_load(model, missing, unexpected, loaded="base")
            missing, unexpected = model.load_state_dict(ckpt[training.ADAPTER_KEY], strict=False)
            validate_lora_state_dict_load(model, missing, unexpected, loaded="adapter")
        else:
            model.load_state_dict(ckpt[training.MODEL_KEY])
        self._model = model.eval()

    def evaluate(self) -> dict[str, Any]:
        """Runs the tasks; prints the harness's table, writes ``output_dir/eleuther_eval_results.json`` and
        returns the per-task results."""
        if self._takes_images:
            lm = TuneVisionLM(
                self._model,
                self._tokenizer,
                self._max_seq_length,
                self._batch_size,
                self._enable_kv_cache,
                self._dtype,
            )
        else:
            lm = TuneLM(self._model, self._tokenizer, self._max_seq_length, self._batch_size, self._enable_kv_cache)
        start = time.perf_counter()
        output = evaluate(lm, self._task_dict, limit=self._limit)
        log.info("Evaluated %s in %.1f s.", ", ".join(self._tasks), time.perf_counter() - start)
        print(make_table(output), flush=True)
        self._output_dir.mkdir(parents=True, exist_ok=True)
        path = self._output_dir / "eleuther_eval_results.json"
        temp = path.with_name(f".{path.name}.tmp")
        try:  # written whole, then renamed: a results file of an earlier run is never left half overwritten
            temp.write_text(json.dumps(output["results"], indent=2, sort_keys=True, default=str))
            temp.replace(path)
        except OSError as err:  # a full disk, say
            temp.unlink(missing_ok=True)
            raise utils.TuneError(
                f"Could not write the results {path}: {err}. The table above holds them, and a {path.name} written "
                "before is as it was; free disk space or set output_dir to another disk to have the file."
            ) from err
        log.info("Results written to %s.", path)
        return output["results"]


def _tasks_with_images(task_dict: dict) -> dict[str, str]:
    """The tasks in ``get_task_dict``'s answer (groups nest their tasks) that give the model images: name ->
    ``output_type``."""
    found = {}
    for name, task in task_dict.items():
        if isinstance(task, dict):
            found.update(_tasks_with_images(task))
        elif getattr(task, "MULTIMODAL", False):
            found[str(name)] = task.OUTPUT_TYPE
    return found


@config.parse
def recipe_main(cfg: DictConfig) -> None:
    """Entry point: ``tune run eleuther_eval --config CONFIG [key=value ...]``."""
    config.log_config(recipe_name="EleutherEvalRecipe", cfg=cfg)
    recipe = EleutherEvalRecipe(cfg)
    recipe.setup(cfg)
    recipe.evaluate()


if __name__ == "__main__":
    sys.exit(recipe_main())
