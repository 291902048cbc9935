"""Tests of tune/training/_finetuning_schedule.py on a tiny Llama (3 layers, untied output)."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests._helpers import free_port
from tune.models.llama3_2 import llama3_2, lora_llama3_2
from tune.modules.peft import get_adapter_params, set_trainable_params
from tune.training import FinetuningSchedule, auto_finetuning_phases, get_cosine_schedule_with_warmup

TINY = dict(
    vocab_size=32,
    num_layers=3,
    num_heads=2,
    num_kv_heads=1,
    embed_dim=16,
    max_seq_len=16,
    intermediate_dim=32,
    tie_word_embeddings=False,
)
PHASES = [
    {"params": ["output", "norm"], "transition": {"after_steps": 2}},
    {"params": ["layers.2.*"], "lr": 5e-4, "transition": {"after_steps": 2}},
    {"params": ["re:layers\\.[01]\\..*", "tok_embeddings"]},
]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return llama3_2(**TINY)


def _train_step(model: nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> None:
    tokens = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(seed))
    logits = model(tokens)
    F.cross_entropy(logits[:, :-1].reshape(-1, 32), tokens[:, 1:].reshape(-1)).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _names(optimizer: torch.optim.Optimizer, model: nn.Module) -> list[set[str]]:
    by_id = {id(p): n for n, p in model.named_parameters()}
    return [{by_id[id(p)] for p in group["params"]} for group in optimizer.param_groups]


def test_after_steps_phases_add_param_groups_and_frozen_params_do_not_change():
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    schedule = FinetuningSchedule(PHASES)
    lines = schedule.setup(model, optimizer)
    assert lines[0] == "finetuning schedule: 3 phases"
    assert _names(optimizer, model) == [{"output.weight", "norm.weight"}]
    assert [n for n, p in model.named_parameters() if p.requires_grad] == ["norm.weight", "output.weight"]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    transitions = {}
    for step in range(1, 6):
        _train_step(model, optimizer, seed=step)
        out = schedule.step(step, epoch=0)
        if out:
            transitions[step] = out
        if step == 3:  # layers 0-1 and the embeddings are still frozen: unchanged despite weight decay
            for name, value in before.items():
                if name.startswith(("layers.0.", "layers.1.", "tok_embeddings")):
                    assert torch.equal(dict(model.named_parameters())[name], value), name
    assert sorted(transitions) == [2, 4]
    assert transitions[2][0].startswith("finetuning schedule: phase 0 -> 1 at step 2 (epoch 0, after_steps=2 reached)")
    assert "join the optimizer as param group 1 (lr 0.0005)" in transitions[2][0]
    assert "param group 2 (lr 0.001)" in transitions[4][0]
    groups = _names(optimizer, model)
    assert [g["lr"] for g in optimizer.param_groups] == [1e-3, 5e-4, 1e-3]
    assert all(n.startswith("layers.2.") for n in groups[1]) and len(groups[1]) == 9  # 4 attn + 3 mlp + 2 norms
    assert "tok_embeddings.weight" in groups[2] and len(groups[2]) == 1 + 2 * 9
    assert all(p.requires_grad for p in model.parameters())
    assert schedule.step(6, epoch=0) is None  # the last phase never ends
    changed = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    assert len(changed) == len(before)  # step 5 trained everything


def test_after_epochs_transition_counts_epochs_since_the_phase_began():
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    schedule = FinetuningSchedule(
        [
            {"params": ["output"], "transition": {"after_epochs": 1}},
            {"params": ["norm"], "transition": {"after_epochs": 2}},
            {"params": ["layers.*"]},
        ]
    )
    schedule.setup(model, optimizer)
    # (step, completed epochs) as a recipe reports them: after each step, and at each epoch end
    events = [(1, 0), (2, 0), (2, 1), (3, 1), (4, 1), (4, 2), (5, 2), (6, 2), (6, 3)]
    phases = []
    for step, epoch in events:
        schedule.step(step, epoch)
        phases.append(schedule.current_phase)
    # phase 1 begins when epoch 1 completes; phase 2 two epochs after that, when epoch 3 completes
    assert phases == [0, 0, 1, 1, 1, 1, 1, 1, 2]
    assert len(optimizer.param_groups) == 3


def test_on_plateau_transition_after_k_evaluations_without_improvement():
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    schedule = FinetuningSchedule([{"params": ["output"], "transition": {"on_plateau": 2}}, {"params": ["norm"]}])
    schedule.setup(model, optimizer)
    assert schedule.step(1, 0) is None  # no validation loss: a plateau cannot be judged
    # best 1.0 -> 0.9 (improves), 0.95 (1 without improvement), 0.93 (2) -> transition on the 4th evaluation
    results = [schedule.step(i, 0, val_loss=torch.tensor(v)) for i, v in enumerate([1.0, 0.9, 0.95, 0.93], start=2)]
    assert results[:3] == [None, None, None]
    assert "on_plateau=2 reached" in results[3][0] and schedule.current_phase == 1


def test_resume_in_a_later_phase_restores_groups_and_optimizer_state():
    def build():
        model = _model()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        scheduler = get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=2, num_training_steps=20)
        schedule = FinetuningSchedule(PHASES)
        return model, optimizer, scheduler, schedule

    model, optimizer, scheduler, schedule = build()
    schedule.setup(model, optimizer, scheduler)
    for step in range(1, 4):  # phase 1 begins at step 2
        _train_step(model, optimizer, seed=step)
        scheduler.step()
        schedule.step(step, epoch=0)
    assert schedule.current_phase == 1
    # deep copies: state dicts share tensors and lists with the live objects (a recipe writes them to disk)
    saved = copy.deepcopy(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "lr_scheduler": scheduler.state_dict(),
            "schedule": schedule.state_dict(),
        }
    )
    # the uninterrupted run: 3 more steps (phase 2 begins at step 4)
    for step in range(4, 7):
        _train_step(model, optimizer, seed=step)
        scheduler.step()
        schedule.step(step, epoch=0)

    resumed, optimizer2, scheduler2, schedule2 = build()
    resumed.load_state_dict(saved["model"])
    schedule2.load_state_dict(saved["schedule"])  # before setup: applied by setup
    lines = schedule2.setup(resumed, optimizer2, scheduler2)
    assert lines[-1] == "finetuning schedule: resumed in phase 1 of 3 (began at step 2, epoch 0)"
    optimizer2.load_state_dict(saved["optimizer"])
    scheduler2.load_state_dict(saved["lr_scheduler"])
    assert _names(optimizer2, resumed) == _names(optimizer, model)[:2]
    for step in range(4, 7):
        _train_step(resumed, optimizer2, seed=step)
        scheduler2.step()
        schedule2.step(step, epoch=0)
    assert schedule2.current_phase == 2
    assert [g["lr"] for g in optimizer2.param_groups] == [g["lr"] for g in optimizer.param_groups]
    for (name, a), b in zip(model.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_new_groups_follow_the_lr_schedulers_multiplier():
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=4, num_training_steps=100)
    schedule = FinetuningSchedule(
        [{"params": ["output"], "transition": {"after_steps": 2}}, {"params": ["norm"], "lr": 0.5}]
    )
    schedule.setup(model, optimizer, scheduler)
    for step in (1, 2):
        optimizer.step()
        scheduler.step()
        schedule.step(step, 0)
    # warmup: the multiplier after 2 of 4 warmup steps is 2/4, for the new group too (0.5 * 0.5)
    assert [g["lr"] for g in optimizer.param_groups] == [0.5, 0.25]
    optimizer.step()
    scheduler.step()
    assert [g["lr"] for g in optimizer.param_groups] == [0.75, 0.375]


def test_auto_orders_output_side_then_layers_from_last_then_embeddings():
    names = [n for n, _ in _model().named_parameters()]
    phases = auto_finetuning_phases(names, {"after_steps": 5})
    assert [p["params"] for p in phases] == [
        ["norm.weight", "output.weight"],
        ["layers.2.*"],
        ["layers.1.*"],
        ["layers.0.*"],
        ["tok_embeddings.weight"],
    ]
    assert all(p["transition"] == {"after_steps": 5} for p in phases[:-1]) and "transition" not in phases[-1]
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    schedule = FinetuningSchedule("auto", auto_transition={"after_steps": 1})
    schedule.setup(model, optimizer)
    for step in range(1, 5):
        schedule.step(step, 0)
    assert schedule.current_phase == 4 and len(optimizer.param_groups) == 5


def test_auto_on_a_lora_model_schedules_only_the_adapters():
    torch.manual_seed(0)
    model = lora_llama3_2(["q_proj", "v_proj"], **TINY, lora_rank=2, lora_alpha=4.0)
    set_trainable_params(model, get_adapter_params(model))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    schedule = FinetuningSchedule("auto", auto_transition={"after_steps": 1})
    schedule.setup(model, optimizer)
    # output/norm/embeddings are frozen base weights: only the three layers' adapters remain, last layer first
    assert [p.patterns for p in schedule.phases] == [("layers.2.*",), ("layers.1.*",), ("layers.0.*",)]
    assert _names(optimizer, model) == [
        {f"layers.2.attn.{m}.lora_{x}.weight" for m in ("q_proj", "v_proj") for x in "ab"}
    ]
    with pytest.raises(ValueError, match=r"phase\(s\) 0 select no trainable parameter.*LoRA base weights"):
        FinetuningSchedule([{"params": ["output"]}]).setup(model, torch.optim.SGD(model.parameters(), lr=0.1))


def test_invalid_patterns_and_phases_are_reported_all_at_once():
    names = [n for n, _ in _model().named_parameters()]
    schedule = FinetuningSchedule(
        [{"params": ["outptu"], "transition": {"after_steps": 1}}, {"params": ["layers.7.*", "re:layers\\.0\\..*"]}]
    )
    with pytest.raises(ValueError) as err:
        schedule.validate(names)  # parameter names only: nothing allocated
    message = str(err.value)
    assert "finetuning_schedule[0].params: 'outptu' matches no parameter; close names: output" in message
    assert "finetuning_schedule[1].params: 'layers.7.*' matches no parameter" in message
    assert "re:layers" not in message  # the valid regex is not reported
    with pytest.raises(ValueError) as err:
        FinetuningSchedule([{"params": [], "transition": {"after_step": 1}}, {"params": ["re:("], "lr": "x"}])
    message = str(err.value)
    assert "finetuning_schedule[0].params: must be a non-empty list" in message
    assert "unknown transition 'after_step' (did you mean 'after_steps'?)" in message
    assert "'re:(' is not a valid regular expression" in message
    assert "finetuning_schedule[1].lr: must be a non-negative number" in message
    with pytest.raises(ValueError, match="every phase but the last needs a transition"):
        FinetuningSchedule([{"params": ["output"]}, {"params": ["norm"]}])
    with pytest.raises(ValueError, match="a list of phases or the string 'auto'"):
        FinetuningSchedule("gradual")


def test_wrapper_prefixes_are_ignored_and_setup_refuses_a_stepped_optimizer():
    model = nn.Sequential()
    model.add_module("_checkpoint_wrapped_module", nn.Linear(2, 2))
    schedule = FinetuningSchedule([{"params": ["weight"], "transition": {"after_steps": 1}}, {"params": ["bias"]}])
    schedule.validate(model)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    with pytest.raises(ValueError, match="must run before the optimizer's first step"):
        schedule.setup(model, optimizer)


def _fsdp_worker(rank: int, port: int, tokens: torch.Tensor, result_path: str) -> None:
    import os

    import torch.distributed as dist

    from tune.training import shard_model

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        model = _model()
        shard_model(model)  # one FSDP2 unit per layer, then the root: every parameter is a DTensor
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        schedule = FinetuningSchedule(PHASES)
        schedule.setup(model, optimizer)
        for step in range(1, 6):
            _fixed_step(model, optimizer, tokens[rank * 2 : (rank + 1) * 2])  # each rank half of the batch
            schedule.step(step, epoch=0)
        state = {n: p.full_tensor() for n, p in model.named_parameters()}
        kinds = {type(p).__name__ for p in model.parameters()}
        if rank == 0:
            torch.save({"state": state, "kinds": sorted(kinds), "groups": len(optimizer.param_groups)}, result_path)
    finally:
        dist.destroy_process_group()


def _fixed_step(model: nn.Module, optimizer: torch.optim.Optimizer, tokens: torch.Tensor) -> None:
    logits = model(tokens)
    F.cross_entropy(logits[:, :-1].reshape(-1, 32), tokens[:, 1:].reshape(-1)).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


@pytest.mark.integration
def test_fsdp2_sharded_run_matches_one_process(tmp_path):
    import torch.multiprocessing as mp

    tokens = torch.randint(0, 32, (4, 8), generator=torch.Generator().manual_seed(0))
    # the reference: one process, the whole batch (the mean of the two ranks' equal-sized half-batch losses)
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    schedule = FinetuningSchedule(PHASES)
    schedule.setup(model, optimizer)
    for step in range(1, 6):
        _fixed_step(model, optimizer, tokens)
        schedule.step(step, epoch=0)
    mp.spawn(_fsdp_worker, args=(free_port(), tokens, str(tmp_path / "rank0.pt")), nprocs=2)
    got = torch.load(tmp_path / "rank0.pt", weights_only=True)
    assert got["kinds"] == ["DTensor"] and got["groups"] == 3
    for name, value in model.named_parameters():
        torch.testing.assert_close(got["state"][name], value.detach(), atol=1e-5, rtol=0, msg=name)
