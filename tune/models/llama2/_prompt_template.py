"""``Llama2ChatTemplate``: torchtune's name for the Llama 2 ``[INST] <<SYS>>`` chat layout."""

from tune.data import Message
from tune.models._common import inst_template


class Llama2ChatTemplate:
    """The Llama 2 chat template (``meta-llama/Llama-2-7b-chat-hf``).

    Given as ``prompt_template`` to :func:`~tune.models.llama2.llama2_tokenizer` (the default, as an instance,
    the class, or its dotted name), it selects the tokenizer's Llama 2 chat format, which lays the turns out with
    ``[INST]``, ``<<SYS>>`` and a BOS/EOS pair around each exchange. Called on messages (with any other
    tokenizer), it writes the same layout as text: ``"[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] "``,
    the system prompt in the first user turn only.
    """

    template = {
        "system": ("<<SYS>>\n", "\n<</SYS>>\n\n"),
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
        return "Llama2ChatTemplate()"
