from tests.tune.datasets._helpers import ByteTokenizer
from tune.data import Message, alpaca_prompt
from tune.datasets import PackedDataset, alpaca_cleaned_dataset, alpaca_dataset

ROWS = [
    {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"},
    {"instruction": "Say hello.", "input": "", "output": "Hello!"},
]


def test_prompt_with_and_without_input_and_full_loss_by_default(write_json, cache_dir):
    tok = ByteTokenizer()
    ds = alpaca_dataset(tok, source="json", data_files=write_json(ROWS), cache_dir=cache_dir)
    for i, row in enumerate(ROWS):
        prompt = alpaca_prompt(row["instruction"], row["input"])
        messages = [Message("user", prompt), Message("assistant", row["output"])]
        expected, _ = tok.tokenize_messages(messages)
        assert ds[i]["tokens"] == expected
        assert ds[i]["labels"] == expected  # train_on_input=True: every token is trained


def test_train_on_input_false_masks_exactly_the_prompt(write_json, cache_dir):
    tok = ByteTokenizer()
    ds = alpaca_dataset(tok, source="json", data_files=write_json(ROWS), cache_dir=cache_dir, train_on_input=False)
    prompt_len = 1 + 1 + len(alpaca_prompt("Say hello.").encode()) + 1  # BOS, <user>, prompt bytes, <end>
    labels = ds[1]["labels"]
    assert labels[:prompt_len] == [-100] * prompt_len
    assert -100 not in labels[prompt_len:]
    assert tok.decode(labels[prompt_len:]) == "Hello!"


def test_column_map_and_packed(write_json, cache_dir):
    rows = [{"task": r["instruction"], "context": r["input"], "answer": r["output"]} for r in ROWS]
    tok = ByteTokenizer(max_seq_len=512)
    ds = alpaca_dataset(tok, source="json", data_files=write_json(rows), cache_dir=cache_dir, packed=True,
                        column_map={"instruction": "task", "input": "context", "output": "answer"})  # fmt: skip
    assert isinstance(ds, PackedDataset) and len(ds) == 1  # both samples (< 256 tokens each) share one pack
    assert ds[0]["tokens"].shape == (512,)


def test_cleaned_variant_defaults_to_its_hub_source():
    assert alpaca_cleaned_dataset.keywords == {"source": "yahma/alpaca-cleaned"}
