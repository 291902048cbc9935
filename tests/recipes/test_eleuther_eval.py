"""Integration test of recipes/eleuther_eval.py: lm-eval 0.4.x on local tasks and local data (no downloads).

Two tasks written here: a multiple-choice one (scored by log-likelihood) and a ``generate_until`` one. Expected
values come from the same checkpoint run with ``transformers``: the multiple-choice accuracy is recomputed by
summing the continuation log-probabilities from Hugging Face logits (the harness's definition: context and
continuation tokenised together, the choice with the highest sum wins); the generation task's targets ARE the
Hugging Face greedy continuations, so the recipe scores exact_match 1.0 exactly when it generates the same text.
"""

import json
import random
from pathlib import Path

import pytest
import torch

from tests.recipes.utils import ASSETS, hf_greedy_tokens, mc_task_yaml, run_recipe

pytest.importorskip("lm_eval", reason="the eval extra (lm-eval) is not installed")
pytestmark = pytest.mark.integration

CONFIG = ASSETS / "eval_tiny.yaml"
MAX_GEN_TOKS = 6

_GEN_TASK = """\
task: tiny_arith_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: {max_gen_toks}
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""


def _tokenizer(assets: Path):
    from tune.models.llama2 import llama2_tokenizer

    return llama2_tokenizer(str(assets / "tokenizer.model"), prompt_template=None)


def _questions(num_docs: int = 60) -> list[tuple[str, list[str], int]]:
    # four choices in a random order, so the right answer's position varies: an evaluator that always picks one
    # position, or mixes up the documents' choices, scores differently from the reference
    rng = random.Random(0)
    docs = []
    for _ in range(num_docs):
        a, b = rng.randrange(20), rng.randrange(20)
        choices = [str(a + b), str(a + b + 1), str(a * b + 2), f"{a} {b}"]
        order = rng.sample(range(4), 4)
        docs.append((f"{a} + {b} =", [choices[i] for i in order], order.index(0)))
    return docs


def _expected_accuracy(model, tokenizer, docs) -> float:
    correct = 0
    for question, choices, label in docs:
        context = f"Question: {question}\nAnswer:"
        scores = []
        for choice in choices:
            context_ids = tokenizer.encode(context, add_bos=True, add_eos=False)
            whole = tokenizer.encode(context + " " + choice, add_bos=True, add_eos=False)
            with torch.no_grad():
                logprobs = model(input_ids=torch.tensor([whole])).logits[0].log_softmax(-1)
            # token i is predicted at position i - 1
            scores.append(sum(logprobs[i - 1, whole[i]].item() for i in range(len(context_ids), len(whole))))
        correct += int(max(range(len(choices)), key=scores.__getitem__) == label)
    return correct / len(docs)


def _greedy_answer(model, tokenizer, question: str) -> str:
    prompt = tokenizer.encode(f"Question: {question}\nAnswer:", add_bos=True, add_eos=False)
    new = hf_greedy_tokens(model, prompt, MAX_GEN_TOKS, tokenizer.eos_id, tokenizer.pad_id)
    return tokenizer.decode(new).split("\n")[0]


def test_local_tasks_match_transformers(tiny_assets, tmp_path):
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(tiny_assets / "llama", dtype=torch.float32).eval()
    tokenizer = _tokenizer(tiny_assets)
    docs = _questions()
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    mc = tasks / "mc.jsonl"
    mc.write_text("\n".join(json.dumps({"question": q, "choices": c, "label": lab}) for q, c, lab in docs))
    gen = tasks / "gen.jsonl"
    answers = [_greedy_answer(model, tokenizer, q) for q, _, _ in docs[:6]]
    assert any(a.strip() for a in answers), "the reference generated only empty answers"
    gen.write_text("\n".join(json.dumps({"question": q, "answer": a}) for (q, _, _), a in zip(docs, answers)))
    (tasks / "tiny_arith_mc.yaml").write_text(mc_task_yaml("tiny_arith_mc", mc))
    (tasks / "tiny_arith_gen.yaml").write_text(_GEN_TASK.format(data=gen, max_gen_toks=MAX_GEN_TOKS))

    out = tmp_path / "out"
    overrides = [f"assets_dir={tiny_assets}", f"output_dir={out}", f"include_path={tasks}"]
    proc = run_recipe("eleuther_eval", CONFIG, overrides, cwd=tmp_path, timeout=300)
    results = json.loads((out / "eleuther_eval_results.json").read_text())
    assert "tiny_arith_mc" in proc.stdout  # the harness's table

    expected = _expected_accuracy(model, tokenizer, docs)
    assert 0 < expected < 1  # the random model is right on some documents and wrong on others
    # one document scored differently moves the accuracy by 1/60: the harness must agree on (almost) every winner
    assert results["tiny_arith_mc"]["acc,none"] == pytest.approx(expected, abs=1e-9)
    assert results["tiny_arith_gen"]["exact_match,none"] == 1.0
