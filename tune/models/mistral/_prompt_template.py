"""``MistralChatTemplate``: torchtune's name for the Mistral ``[INST]`` chat layout."""

from tune.data import Message
from tune.models._common import inst_template


class MistralChatTemplate:
    """The Mistral chat template (``mistralai/Mistral-7B-Instruct-v0.2``).

    Given as ``prompt_template`` to :func:`~tune.models.mistral.mistral_tokenizer` (the default, as an instance,
    the class, or its dotted name), it selects the tokenizer's Mistral chat format. Called on messages (with any
    other tokenizer), it writes the same layout as text: ``"[INST] {user} [/INST] "``, a system prompt followed by
    a blank line at the start of the first user turn (torchtune's template rejects system messages; the Hugging
    Face template folds them in like this).
    """

    template = {
        "system": ("", "\n\n"),
        "user": ("[INST] ", " [/INST] "),
        "assistant": ("", ""),
        "ipython": ("", ""),
    }

    def __call__(self, messages: list[Message], inference: bool = False) -> list[Message]:
        """Returns new messages laid out as in the class docstring.

        Args:
            messages (list[Message]): one conversation.
            inference (bool): unused; accepted for the prompt-template call.

        Returns:
            list[Message]: the templated conversation.
        """
        return inst_template(messages, self.template["system"])

    def __repr__(self) -> str:
        return "MistralChatTemplate()"
