"""A name torchtune exports gives torchtune's tokens: the same conversations and dataset rows through tune and
through torchtune 0.6.1 itself give the same tokens, masks and labels.

The reference is torchtune 0.6.1, imported in a subprocess from the wheel test_torchtune_published_configs.py
downloads into ``~/.cache/tune-tests`` (tests/recipes/_torchtune_tokens.py); both build the tokenizer under the
same name with its default prompt template from the same tiny tokenizer file (tests/tune/data/_tiny_tokenizers.py),
and the datasets from the same JSON files. Families checked, each with the default prompt template of torchtune's
builder: Llama 2 (``Llama2ChatTemplate``), Llama 3 (torchtune's layout; used by Llama 3.1/3.2/3.3 too), Mistral
(``MistralChatTemplate``; with the v0.1/v0.2 and the v0.3 vocabulary), Qwen2 and Qwen 2.5 (vocab.json +
merges.txt), Gemma (also what torchtune's Gemma 2 configs name), Phi-3 mini (tokenizer.model) and Phi-4
(vocab.json + merges.txt). Dataset builders: ``alpaca_dataset``, ``chat_dataset`` (OpenAI and ShareGPT
conversations) and ``instruct_dataset``, with and without ``train_on_input``.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tune.data import _tiny_tokenizers as tiny
from tune.config import instantiate
from tune.data import Message
from tune.models.llama3 import llama3_special_tokens

pytestmark = pytest.mark.integration

_WHEEL = (
    Path(os.environ.get("TUNE_TEST_CACHE", Path.home() / ".cache" / "tune-tests"))
    / "torchtune-0.6.1"
    / "torchtune-0.6.1-py3-none-any.whl"
)
_ROOT = Path(__file__).resolve().parents[2]
_ALPACA_PROMPT = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\nName the capital of France.\n\n### Response:\n"
)
_ALPACA_ROWS = [
    {"instruction": "Name the capital of France.", "input": "", "output": "Paris is the capital."},
    {"instruction": "Add the numbers.", "input": "12 and 30", "output": " 42 \n"},
    {"instruction": "Explain, please:\ncafé 42", "input": "  the quick brown fox ", "output": "One two three.\n\n"},
]
_OPENAI_ROWS = [
    {
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": "Paris (a city on a river)."},
            {"role": "user", "content": "Why? Please explain, café 42 times\nthen stop. "},
            {"role": "assistant", "content": "2024: the quick brown fox!\n\nOne two three."},
        ]
    },
    {
        "messages": [
            {"role": "user", "content": " hello  world\n"},
            {"role": "assistant", "content": " one two \n"},
        ]
    },
]
_SHAREGPT_FROM = {"system": "system", "user": "human", "assistant": "gpt"}
_SHAREGPT_ROWS = [
    {"conversations": [{"from": _SHAREGPT_FROM[m["role"]], "value": m["content"]} for m in row["messages"]]}
    for row in _OPENAI_ROWS
]
_INSTRUCT_ROWS = [
    {"input": "Name the capital of France.", "output": "Paris is the capital."},
    {"input": "Add the numbers:\n12 and 30 ", "output": " 42 \n"},
]


def _conversations(train_on_input: bool) -> list[list[dict]]:
    """Alpaca-style and chat conversations (system prompt, two exchanges, edge whitespace) as plain dicts."""
    masked = not train_on_input
    return [
        [
            {"role": "user", "content": _ALPACA_PROMPT, "masked": masked},
            {"role": "assistant", "content": "Paris is the capital.", "masked": False},
        ],
        [
            {"role": "system", "content": "You are a helpful assistant.", "masked": masked},
            *[
                {"role": m.role, "content": m.text_content, "masked": masked and m.role != "assistant"}
                for m in tiny.conversation(system=False)
            ],
        ],
        [
            {"role": "user", "content": " hello  world\n", "masked": masked},
            {"role": "assistant", "content": " one two \n", "masked": False},
        ],
    ]


def _llama3_special_tokens(directory: Path) -> Path:
    """A ``tokenizer.json`` holding only ``added_tokens``: Llama 3's special tokens as torchtune 0.6.1 names them
    (``<|step_id|>``, ``<|image|>``, ``<|video|>`` included), numbered after the tiny tiktoken file's ranks as the
    real ones follow the 128000 ranks of Llama 3's."""
    num_ranks = len(tiny.tiktoken_file().read_text().splitlines())
    special = llama3_special_tokens(num_ranks)
    special["<|step_id|>"] = special.pop("<|reserved_special_token_2|>")
    special["<|video|>"] = special.pop("<|reserved_special_token_4|>")
    special["<|image|>"] = num_ranks + 256
    path = directory / "llama3_special_tokens.json"
    path.write_text(json.dumps({"added_tokens": [{"id": i, "content": c} for c, i in special.items()]}))
    return path


def _tokenizers(directory: Path) -> dict[str, dict]:
    """Each family's torchtune tokenizer builder (the name after ``torchtune.``) and its file arguments. The tiny
    byte-level BPE and Phi-3 vocabularies are far smaller than the real ones, so their special tokens' ids come
    from ``special_tokens_path`` (the ids torchtune's builders otherwise assume, 151643 and up, 32000 and up,
    100256 and up, are those of the real vocabularies)."""
    llama3 = {"path": str(tiny.tiktoken_file()), "special_tokens_path": str(_llama3_special_tokens(directory))}
    sentencepiece = str(tiny.sentencepiece_model() / "tokenizer.model")
    mistral_v0_3 = str(tiny.sentencepiece_model(mistral_v0_3=True) / "tokenizer.model")
    qwen = tiny.qwen_tokenizer_json()
    qwen_files = {
        "path": str(qwen / "vocab.json"),
        "merges_file": str(qwen / "merges.txt"),
        "special_tokens_path": str(qwen / "tokenizer.json"),
    }
    phi3 = tiny.phi3_tokenizer_dir()
    phi4 = tiny.phi4_bpe_files()
    phi4_files = {
        "vocab_path": str(phi4 / "vocab.json"),
        "merges_path": str(phi4 / "merges.txt"),
        "special_tokens_path": str(phi4 / "tokenizer.json"),
    }
    return {
        "llama2": {"component": "models.llama2.llama2_tokenizer", "kwargs": {"path": sentencepiece}},
        "llama3": {"component": "models.llama3.llama3_tokenizer", "kwargs": llama3},
        "mistral": {"component": "models.mistral.mistral_tokenizer", "kwargs": {"path": sentencepiece}},
        "mistral v0.3 vocabulary": {"component": "models.mistral.mistral_tokenizer", "kwargs": {"path": mistral_v0_3}},
        "qwen2": {"component": "models.qwen2.qwen2_tokenizer", "kwargs": qwen_files},
        "qwen2_5": {"component": "models.qwen2_5.qwen2_5_tokenizer", "kwargs": qwen_files},
        "gemma": {
            "component": "models.gemma.gemma_tokenizer",
            "kwargs": {"path": str(tiny.gemma_sentencepiece_model() / "tokenizer.model")},
        },
        "phi3": {
            "component": "models.phi3.phi3_mini_tokenizer",
            "kwargs": {"path": str(phi3 / "tokenizer.model"), "special_tokens_path": str(phi3 / "tokenizer.json")},
        },
        "phi4": {"component": "models.phi4.phi4_tokenizer", "kwargs": phi4_files},
    }


def _datasets(directory: Path) -> list[dict]:
    """torchtune dataset builders (the name after ``torchtune.``), their arguments and the number of rows, on
    small JSON files written into ``directory``."""
    files = {"alpaca": _ALPACA_ROWS, "openai": _OPENAI_ROWS, "sharegpt": _SHAREGPT_ROWS, "instruct": _INSTRUCT_ROWS}
    for name, rows in files.items():
        (directory / f"{name}.json").write_text(json.dumps(rows))

    def common(name: str) -> dict:
        return {"source": "json", "data_files": str(directory / f"{name}.json"), "split": "train",
                "cache_dir": str(directory / "hf-cache")}  # fmt: skip

    openai = {"conversation_column": "messages", "conversation_style": "openai"}
    sharegpt = {"conversation_column": "conversations", "conversation_style": "sharegpt"}
    builders = [
        ("datasets.alpaca_dataset", "alpaca", {}),
        ("datasets.chat_dataset", "openai", openai),
        ("datasets.chat_dataset", "sharegpt", sharegpt),
        ("datasets.instruct_dataset", "instruct", {}),
    ]
    return [
        {"component": component, "kwargs": {**common(name), **extra, "train_on_input": train_on_input},
         "count": len(files[name])}
        for component, name, extra in builders
        for train_on_input in (True, False)
    ]  # fmt: skip


def _torchtune(cases: list[dict]) -> list:
    """Runs tests/recipes/_torchtune_tokens.py on ``cases`` with torchtune's wheel importable: its results."""
    assert _WHEEL.is_file(), f"{_WHEEL} is missing: run tests/recipes/test_torchtune_published_configs.py once"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(_WHEEL), str(_ROOT)])}
    script = _ROOT / "tests" / "recipes" / "_torchtune_tokens.py"
    proc = subprocess.run(
        [sys.executable, str(script)], input=json.dumps(cases), capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout)


def _ours(spec: dict, *args):
    """The component under tune's name, built as a config would build it."""
    return instantiate({"_component_": "tune." + spec["component"], **spec["kwargs"]}, *args)


def _under_torchtune(case: dict) -> dict:
    """``case`` with its components named from ``torchtune.``."""
    out = {**case, "tokenizer": {**case["tokenizer"], "component": "torchtune." + case["tokenizer"]["component"]}}
    if "dataset" in case:
        out["dataset"] = {**case["dataset"], "component": "torchtune." + case["dataset"]["component"]}
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """(tokenizer cases, dataset cases, torchtune's results for both): one torchtune process for the module."""
    root = tmp_path_factory.mktemp("torchtune-tokens")
    tokenizer_cases = [
        {"family": family, "tokenizer": spec, "conversations": _conversations(train_on_input)}
        for family, spec in _tokenizers(root).items()
        for train_on_input in (True, False)
    ]
    dataset_cases = [
        {"family": family, "tokenizer": spec, "dataset": dataset, "count": dataset.pop("count")}
        for family, spec in _tokenizers(root).items()
        for dataset in _datasets(root)
    ]
    torchtune_cases = [_under_torchtune(case) for case in tokenizer_cases + dataset_cases]
    results = _torchtune(torchtune_cases)
    return tokenizer_cases, dataset_cases, results


def test_tokenizers_with_default_template_give_torchtunes_tokens_and_masks(reference):
    tokenizer_cases, _, results = reference
    for case, expected in zip(tokenizer_cases, results):
        tokenizer = _ours(case["tokenizer"])
        for conversation, want in zip(case["conversations"], expected):
            messages = [Message(**m) for m in conversation]
            label = f"{case['family']} train_on_input={not conversation[0]['masked']}: {conversation[0]['content']!r}"
            if isinstance(want, str):  # torchtune refuses it (Mistral's template and a system prompt): so does tune
                with pytest.raises(ValueError, match="system"):
                    tokenizer.tokenize_messages(messages)
                continue
            tokens, mask = tokenizer.tokenize_messages(messages)
            assert [tokens, [bool(x) for x in mask]] == want, label


def test_dataset_builders_give_torchtunes_tokens_and_labels(reference):
    tokenizer_cases, dataset_cases, results = reference
    for case, expected in zip(dataset_cases, results[len(tokenizer_cases) :]):
        if isinstance(expected, str):  # torchtune refuses a row (Mistral's template and a system prompt): so does tune
            with pytest.raises(ValueError, match="system message"):  # tune when building, torchtune when reading
                dataset = _ours(case["dataset"], _ours(case["tokenizer"]))
                [dataset[i] for i in range(case["count"])]
            continue
        dataset = _ours(case["dataset"], _ours(case["tokenizer"]))
        got = [
            [list(map(int, dataset[i]["tokens"])), list(map(int, dataset[i]["labels"]))] for i in range(case["count"])
        ]
        assert got == expected, f"{case['family']} {case['dataset']['component']} {case['dataset']['kwargs']}"
