"""docs/models.md is the page tools/models_table.py writes from the model families and configs, and its numbers
are right: the parameter counts the tool takes from meta-device builds equal the ones worked out here by hand
from the sizes' dimensions."""

import functools
import importlib.util
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "models.md"


@functools.cache
def _tool():
    spec = importlib.util.spec_from_file_location("models_table", REPO / "tools" / "models_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def _rendered() -> tuple[str, float]:
    start = time.perf_counter()
    text = _tool().render()
    return text, time.perf_counter() - start


def test_models_page_is_the_one_the_tool_writes():
    text, seconds = _rendered()
    print(f"tools/models_table.py rendered docs/models.md in {seconds:.1f} s")
    assert PAGE.read_text(encoding="utf-8") == text, "docs/models.md is stale: run python tools/models_table.py"
    assert seconds < 60, "building every size on the meta device should take seconds"


def test_every_family_and_size_is_on_the_page():
    from tune.registry import get_model_family

    text, _ = _rendered()
    names = _tool().builtin_family_names()
    assert "llama3_2" in names and "qwen3_moe" in names and "clip" not in names  # clip is a shared component
    for name in names:
        assert f"## `{name}`: " in text
        for size, spec in get_model_family(name).sizes.items():
            assert f"| `{size}` |" in text and f"[{spec.repo}]" in text


def _llama_parameters(dims) -> int:
    """Llama-architecture parameters from the dimensions alone: embedding, per layer the q/k/v/output projections,
    the three MLP matrices and two RMSNorm weights, the final norm, and the output projection unless it is tied."""
    dim, heads, kv_heads = dims["embed_dim"], dims["num_heads"], dims["num_kv_heads"]
    head_dim = dim // heads
    attention = dim * heads * head_dim * 2 + dim * kv_heads * head_dim * 2
    layer = attention + 3 * dim * dims["intermediate_dim"] + 2 * dim
    embedding = dims["vocab_size"] * dim
    output = 0 if dims.get("tie_word_embeddings") else embedding
    return embedding + dims["num_layers"] * layer + dim + output


def test_parameter_counts_match_the_dimensions():
    from tune.registry import get_model_family

    tool = _tool()
    for family, size in (("llama3_2", "llama3_2_1b"), ("llama3_1", "llama3_1_8b"), ("llama2", "llama2_7b")):
        spec = get_model_family(family).sizes[size]
        counted = tool.count_parameters(get_model_family(family).builders[size])
        assert counted == _llama_parameters(spec.dims), size
    # Llama 3.2 1B by hand: 128,256 x 2,048 embedding (tied to the output) + 16 layers x 60,821,504 + 2,048
    assert tool.count_parameters(get_model_family("llama3_2").builders["llama3_2_1b"]) == 1_235_814_400


def test_configs_are_listed_under_the_sizes_they_build_and_their_recipes():
    from tune.registry import get_model_family

    tool = _tool()
    families = {name: get_model_family(name) for name in tool.builtin_family_names()}
    configs = tool.configs_by_size(families)
    one_b = configs[("llama3_2", "llama3_2_1b")]
    assert "llama3_2/1B_lora_single_device" in one_b["lora_finetune_single_device"]
    assert "llama3_2/1B_qlora_single_device" in one_b["lora_finetune_single_device"]  # a qlora_ builder
    # a distillation config builds two sizes: the student and the teacher, of another family
    kd = "llama3_2/8B_to_1B_KD_lora_single_device"
    assert kd in one_b["knowledge_distillation_single_device"]
    assert kd in configs[("llama3_1", "llama3_1_8b")]["knowledge_distillation_single_device"]
    # the demo's configs build the component builder with their own dimensions, no released size
    assert not any(name.startswith("demo/") for by in configs.values() for names in by.values() for name in names)
