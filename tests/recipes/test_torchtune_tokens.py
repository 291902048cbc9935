"""A name torchtune exports gives torchtune's tokens: the same conversations and dataset rows through tune and
through torchtune 0.6.1 itself give the same tokens, masks and labels.

The reference is torchtune 0.6.1, imported in a subprocess from the wheel test_torchtune_published_configs.py
downloads into ``~/.cache/tune-tests`` (tests/recipes/_torchtune_tokens.py); both build the tokenizer under the
same name with its default prompt template from the same tiny tokenizer file (tests/tune/data/_tiny_tokenizers.py),
and the datasets from the same JSON file. Families checked: Llama 2 (its default ``Llama2ChatTemplate``), Llama 3
(torchtune's layout; used by Llama 3.1/3.2/3.3 too), Mistral
(``MistralChatTemplate``; with the v0.1/v0.2 and the v0.3 vocabulary).
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
    """Each family's torchtune tokenizer builder (the name after ``torchtune.``) and its file arguments."""
    llama3 = {"path": str(tiny.tiktoken_file()), "special_tokens_path": str(_llama3_special_tokens(directory))}
    sentencepiece = str(tiny.sentencepiece_model() / "tokenizer.model")
    mistral_v0_3 = str(tiny.sentencepiece_model(mistral_v0_3=True) / "tokenizer.model")
    return {
        "llama2": {"component": "models.llama2.llama2_tokenizer", "kwargs": {"path": sentencepiece}},
        "llama3": {"component": "models.llama3.llama3_tokenizer", "kwargs": llama3},
        "mistral": {"component": "models.mistral.mistral_tokenizer", "kwargs": {"path": sentencepiece}},
        "mistral v0.3 vocabulary": {"component": "models.mistral.mistral_tokenizer", "kwargs": {"path": mistral_v0_3}},
    }


def _datasets(data_file: Path, cache: Path) -> list[dict]:
    """torchtune dataset builders (the name after ``torchtune.``) and their arguments, on the JSON file."""
    common = {"source": "json", "data_files": str(data_file), "split": "train", "cache_dir": str(cache)}
    return [
        {"component": "datasets.alpaca_dataset", "kwargs": {**common, "train_on_input": True}},
        {"component": "datasets.alpaca_dataset", "kwargs": {**common, "train_on_input": False}},
    ]


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
    data_file = root / "alpaca.json"
    data_file.write_text(json.dumps(_ALPACA_ROWS))
    tokenizer_cases = [
        {"family": family, "tokenizer": spec, "conversations": _conversations(train_on_input)}
        for family, spec in _tokenizers(root).items()
        for train_on_input in (True, False)
    ]
    dataset_cases = [
        {"family": family, "tokenizer": spec, "dataset": dataset, "count": len(_ALPACA_ROWS)}
        for family, spec in _tokenizers(root).items()
        for dataset in _datasets(data_file, root / "hf-cache")
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
        dataset = _ours(case["dataset"], _ours(case["tokenizer"]))
        got = [
            [list(map(int, dataset[i]["tokens"])), list(map(int, dataset[i]["labels"]))] for i in range(case["count"])
        ]
        assert got == expected, f"{case['family']} {case['dataset']['component']} {case['dataset']['kwargs']}"
