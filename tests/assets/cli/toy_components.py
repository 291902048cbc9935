"""Fixture components for `tune validate --show-sample`, imported from the working directory.

A tokenizer with one token per character (id = code point) and a prompt/response dataset whose labels are -100
on the prompt, so the trained span of each sample is exactly its response.
"""


class CharTokenizer:
    def encode(self, text: str, add_bos: bool = True, add_eos: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in token_ids)


class PromptResponseDataset:
    def __init__(self, tokenizer: CharTokenizer, pairs: list[list[str]]):
        self._tokenizer = tokenizer
        self._pairs = pairs

    def __len__(self) -> int:
        return len(self._pairs)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        prompt, response = self._pairs[index]
        prompt_ids, response_ids = self._tokenizer.encode(prompt), self._tokenizer.encode(response)
        return {"tokens": prompt_ids + response_ids, "labels": [-100] * len(prompt_ids) + response_ids}
