"""A trained reward model as a reward function for the GRPO recipes (see :mod:`tune.rlhf._rewards`).

The reward model is a sequence classifier with one output (``llama2_classifier(num_classes=1, ...)``, saved by
the reward-model recipe as a Hugging Face ``*ForSequenceClassification`` checkpoint). A completion's reward is the
model's score at the last token of the conversation (user turn: the prompt, assistant turn: the completion),
tokenised the way the reward model's preference data was.
"""

from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch import nn

from tune.data import Message


class _Checkpointer(Protocol):
    def load_checkpoint(self) -> dict[str, Any]: ...


class RewardModelReward:
    """Scores completions with a trained reward model: a reward function for ``reward_functions``.

    Each (prompt, completion) pair is tokenised as a two-turn conversation, ``[user: prompt, assistant:
    completion]``, with ``tokenizer.tokenize_messages`` (end tokens included), which is how
    ``tune.datasets.preference_dataset`` tokenises the chosen and rejected conversations the reward model was
    trained on; the reward is the score at the sequence's last token. Scoring is batched (right padding, so the
    causal model's scores at real tokens do not depend on it), without gradients, in eval mode, on ``device``.

    In a config, the model, tokenizer and checkpointer are component nodes, built before this class::

        reward_functions:
          - _component_: tune.rlhf.RewardModelReward
            model:
              _component_: tune.models.llama2.llama2_classifier
              num_classes: 1
              ...                                   # the reward model's dimensions
            tokenizer: ${tokenizer}                 # the reward model's tokenizer and chat format
            checkpointer:
              _component_: tune.training.FullModelHFCheckpointer
              checkpoint_dir: my_reward_model/      # a *ForSequenceClassification checkpoint
              checkpoint_files: [model.safetensors]
              model_type: REWARD                    # the family is config.json's model_type
              output_dir: /tmp/unused               # required by the checkpointer, never written here
            device: ${device}

    Args:
        model (nn.Module): the reward model's architecture: a classifier returning ``[b, s, 1]`` scores.
        tokenizer (Any): the reward model's tokenizer (``tokenize_messages``), with the chat format its training
            data used.
        checkpointer (Any): an object whose ``load_checkpoint()`` returns ``{"model": state_dict}`` in tune's keys
            (``tune.training.FullModelHFCheckpointer`` with ``model_type: REWARD``).
        device (str | torch.device): where the reward model runs; the policy's device. Default ``"cpu"``.
        batch_size (int): sequences per forward pass. Default 64.
        name (str): logged as ``rewards/<name>/mean``. Default ``"reward_model"``.

    Raises:
        ValueError: for a ``batch_size`` below 1, or a checkpoint that is not a one-output classifier of ``model``'s
            shape (a causal language model's checkpoint, say), naming the keys that differ.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        checkpointer: _Checkpointer,
        *,
        device: str | torch.device = "cpu",
        batch_size: int = 64,
        name: str = "reward_model",
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        state_dict = checkpointer.load_checkpoint()["model"]
        _check_classifier_weights(model, state_dict)
        model.load_state_dict(state_dict)
        self.device = torch.device(device)
        self.model = model.to(self.device).eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.name = name

    def tokenize(self, prompt: str, completion: str) -> list[int]:
        """The tokens the reward model scores for one (prompt, completion) pair.

        Args:
            prompt (str): the user turn.
            completion (str): the assistant turn; an empty one is scored as the generation prompt followed by the
                tokenizer's ``eos_id``.

        Returns:
            list[int]: the conversation's tokens, end tokens included.
        """
        user = Message(role="user", content=prompt)
        if not completion.strip():
            # a chat format refuses an empty reply (the policy stopped at once): the prompt as a generation prompt,
            # then the end of sequence, is what the policy produced
            tokens, _ = self.tokenizer.tokenize_messages([user], add_end_tokens=False)
            return [*tokens, self.tokenizer.eos_id]
        tokens, _ = self.tokenizer.tokenize_messages([user, Message(role="assistant", content=completion)])
        return list(tokens)

    @torch.no_grad()
    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **fields: Sequence[Any]) -> torch.Tensor:
        """Scores each completion of its prompt.

        Returns:
            torch.Tensor: ``[len(completions)]`` float32 scores, on the CPU.
        """
        sequences = [self.tokenize(p, c) for p, c in zip(prompts, completions, strict=True)]
        scores = []
        for start in range(0, len(sequences), self.batch_size):
            batch = sequences[start : start + self.batch_size]
            lengths = torch.tensor([len(tokens) for tokens in batch], device=self.device)
            tokens = torch.zeros(len(batch), int(lengths.max()), dtype=torch.long, device=self.device)
            for row, sequence in enumerate(batch):  # right padding: the pad id is never attended to by real tokens
                tokens[row, : len(sequence)] = torch.tensor(sequence, dtype=torch.long)
            output = self.model(tokens)  # [b, s, 1]
            last = output[torch.arange(len(batch), device=self.device), lengths - 1]  # [b, 1]
            scores.append(last[:, 0].float())
        if not scores:
            return torch.zeros(0)
        return torch.cat(scores).cpu()


def _check_classifier_weights(model: nn.Module, state_dict: dict[str, torch.Tensor]) -> None:
    expected = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    loaded = {key: tuple(value.shape) for key, value in state_dict.items()}
    problems = [f"missing {key}" for key in expected if key not in loaded]
    problems += [f"unexpected {key}" for key in loaded if key not in expected]
    problems += [
        f"{key}: checkpoint {loaded[key]}, model {shape}"
        for key, shape in expected.items()
        if key in loaded and loaded[key] != shape
    ]
    if problems:
        shown = "; ".join(problems[:6]) + (f"; and {len(problems) - 6} more" if len(problems) > 6 else "")
        raise ValueError(
            f"The reward checkpoint does not fit the reward model ({shown}). RewardModelReward needs a sequence "
            "classifier with one output (a Hugging Face *ForSequenceClassification checkpoint with num_labels 1, "
            "as the reward-model recipe saves, whose head has one row, not the vocabulary's) and a `model` node "
            "with its dimensions and num_classes: 1. Point the checkpointer at the reward model's checkpoint."
        )
