"""A run stopped mid-epoch and resumed from its checkpoint reproduces the uninterrupted run's losses exactly.

Plain PyTorch loop: shuffled data through StatefulDistributedSampler, gradient accumulation 2, AdamW with a
warmup + cosine LambdaLR, dropout (so the torch RNG state matters), fp32 on CPU.
"""

import math

import torch
from safetensors.torch import save_file
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tune.training.checkpointing import (
    DATALOADER_KEY,
    EPOCHS_KEY,
    LR_SCHEDULER_KEY,
    MODEL_KEY,
    OPT_KEY,
    RNG_KEY,
    STEPS_KEY,
    FullModelTorchTuneCheckpointer,
    StatefulDistributedSampler,
    set_rng_state,
    should_save_checkpoint,
)

EPOCHS, BATCH, ACCUM, STOP_AFTER = 3, 4, 2, 7  # 37 samples -> 10 batches -> 5 steps/epoch; stop mid-epoch 2


def _data():
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(37, 8, generator=g), torch.randint(0, 4, (37,), generator=g))


def _schedule(step):
    return (step + 1) / 3 if step < 3 else 0.5 * (1 + math.cos(math.pi * (step - 3) / 12))


def _setup(checkpoint_dir, output_dir, resume, model_seed):
    torch.manual_seed(model_seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 4))
    ckpt = FullModelTorchTuneCheckpointer(checkpoint_dir, output_dir=output_dir, resume_from_checkpoint=resume)
    state = ckpt.load_checkpoint()
    model.load_state_dict(state[MODEL_KEY])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _schedule)
    dataset = _data()
    sampler = StatefulDistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=3)
    # The loader gets its own generator: by default each new iterator draws a seed from the global torch RNG,
    # which a resumed run would do at a different point than the uninterrupted one.
    loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler, generator=torch.Generator())
    progress = {EPOCHS_KEY: 0, STEPS_KEY: 0}
    if resume:
        optimizer.load_state_dict(state[OPT_KEY])
        scheduler.load_state_dict(state[LR_SCHEDULER_KEY])
        sampler.load_state_dict(state[DATALOADER_KEY])
        set_rng_state(state[RNG_KEY])
        progress = {EPOCHS_KEY: state[EPOCHS_KEY], STEPS_KEY: state[STEPS_KEY]}
    return model, ckpt, optimizer, scheduler, sampler, loader, progress


def _train(checkpoint_dir, output_dir, *, resume=False, stop_after=None, model_seed=0):
    model, ckpt, optimizer, scheduler, sampler, loader, progress = _setup(
        checkpoint_dir, output_dir, resume, model_seed
    )
    losses, step = {}, progress[STEPS_KEY]
    for epoch in range(progress[EPOCHS_KEY], EPOCHS):
        sampler.set_epoch(epoch)
        step_loss = 0.0
        for index, (x, y) in enumerate(loader):
            loss = nn.functional.cross_entropy(model(x), y) / ACCUM
            loss.backward()
            step_loss += loss.item()
            if (index + 1) % ACCUM:
                continue
            optimizer.step(), scheduler.step(), optimizer.zero_grad()
            step += 1
            losses[step], step_loss = step_loss, 0.0
            finished_epoch = index + 1 == len(loader)
            if should_save_checkpoint(step, 1):
                ckpt.save_checkpoint(
                    {
                        MODEL_KEY: model.state_dict(),
                        OPT_KEY: optimizer.state_dict(),
                        LR_SCHEDULER_KEY: scheduler.state_dict(),
                        EPOCHS_KEY: epoch + 1 if finished_epoch else epoch,
                        STEPS_KEY: step,
                        DATALOADER_KEY: sampler.state_dict(),
                    },
                    epoch=epoch,
                    step=step,
                    intermediate_checkpoint=True,
                )
            if step == stop_after:
                return losses
    return losses


def test_resumed_run_matches_uninterrupted_run_exactly(tmp_path):
    checkpoint_dir = tmp_path / "base"
    checkpoint_dir.mkdir()
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 4))
    save_file(base.state_dict(), checkpoint_dir / "model.safetensors")

    full = _train(checkpoint_dir, tmp_path / "full")
    first = _train(checkpoint_dir, tmp_path / "run", stop_after=STOP_AFTER)
    # a different init seed: everything the resumed run needs must come from the checkpoint
    rest = _train(checkpoint_dir, tmp_path / "run", resume=True, model_seed=123)

    assert sorted(full) == list(range(1, 16))
    assert sorted(first) == list(range(1, STOP_AFTER + 1)) and sorted(rest) == list(range(STOP_AFTER + 1, 16))
    diff = max(abs(rest[s] - full[s]) for s in rest)
    print(f"exact resume: max abs loss difference over steps {STOP_AFTER + 1}..15 = {diff}")
    assert diff == 0.0
    assert all(first[s] == full[s] for s in first)
