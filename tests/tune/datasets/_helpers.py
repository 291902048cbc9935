"""Helpers shared by the dataset tests: a small deterministic tokenizer implementing tune.data.ModelTokenizer.

Byte-level: id = byte + 3; 0 pad, 1 BOS, 2 EOS; one header token per role and an end-of-turn token. A conversation
is ``BOS (header content END)* EOS``; every token of a turn, header and END included, carries the turn's mask,
BOS the first turn's and EOS the last turn's. Being a test fixture, it is written to be obviously right, not fast.
"""

from tune.data import Message

HEADERS = {"system": 259, "user": 260, "assistant": 261, "tool": 262, "ipython": 262}
END_OF_TURN = 263


class ByteTokenizer:
    bos_id, eos_id, pad_id = 1, 2, 0
    stop_tokens = [2, END_OF_TURN]

    def __init__(self, max_seq_len: int | None = None, call_log: str | None = None) -> None:
        self.max_seq_len = max_seq_len
        self.call_log = call_log  # when set, every tokenize call appends one byte to this file

    def _count_call(self) -> None:
        if self.call_log is not None:
            with open(self.call_log, "a") as f:
                f.write("x")

    def encode(self, text: str, add_bos: bool = True, add_eos: bool = True) -> list[int]:
        self._count_call()
        ids = [b + 3 for b in text.encode("utf-8")]
        return [self.bos_id] * add_bos + ids + [self.eos_id] * add_eos

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        names = {1: "<s>", 2: "</s>", 0: "<pad>", END_OF_TURN: "<end>"}
        names.update({v: f"<{k}>" for k, v in HEADERS.items() if k != "ipython"})
        out, buf = [], bytearray()
        for t in token_ids:
            if 3 <= t < 259:
                buf.append(t - 3)
                continue
            out.append(buf.decode("utf-8", errors="replace"))
            buf = bytearray()
            if not skip_special_tokens:
                out.append(names[t])
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)

    def tokenize_messages(self, messages: list[Message], *, add_end_tokens: bool = True):
        self._count_call()
        tokens, mask = [self.bos_id], [messages[0].masked]
        for m in messages:
            turn = [HEADERS[m.role]] + [b + 3 for b in m.text_content.encode("utf-8")] + [END_OF_TURN] * m.eot
            tokens += turn
            mask += [m.masked] * len(turn)
        if add_end_tokens:
            tokens.append(self.eos_id)
            mask.append(messages[-1].masked)
        if self.max_seq_len is not None:
            tokens, mask = tokens[: self.max_seq_len], mask[: self.max_seq_len]
        return tokens, mask


def byte_ids(text: str) -> list[int]:
    return [b + 3 for b in text.encode("utf-8")]
