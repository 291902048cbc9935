"""Recipe plumbing read from a config, written once: the checkpointer of a run and the parallel layout of a
distributed one, each setting's error reported at its key."""

from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from tune.config._instantiate import instantiate
from tune.config._training import errors_at
from tune.utils import get_logger

if TYPE_CHECKING:
    import torch

    from tune.training import ParallelDims

log = get_logger(name="tune.config")


def instantiate_checkpointer(
    cfg_checkpointer: DictConfig, *, resume_from_checkpoint: bool, keep_last_n_checkpoints: int | None
) -> Any:
    """Builds the ``checkpointer`` of a recipe config with the run's resume and retention settings.

    Args:
        cfg_checkpointer (DictConfig): the ``checkpointer`` section.
        resume_from_checkpoint (bool): whether the checkpointer reads the newest checkpoint of ``output_dir``
            (False for distributed recipes: their training state comes from the sharded checkpoints).
        keep_last_n_checkpoints (int | None): the run's retention; None leaves the checkpointer's own setting.

    Returns:
        Any: the checkpointer.
    """
    extra: dict[str, Any] = {"resume_from_checkpoint": resume_from_checkpoint}
    if keep_last_n_checkpoints is not None:
        extra["keep_last_n_checkpoints"] = keep_last_n_checkpoints
    return instantiate(cfg_checkpointer, **extra)


def init_parallel(cfg: DictConfig, device: "torch.device") -> "ParallelDims":
    """Starts the process group and builds the device meshes a distributed recipe's config asks for.

    Reads ``dist_backend`` (default NCCL for the model's tensors and gloo for CPU-side state on CUDA, the
    platform's default otherwise), ``tensor_parallel_dim``, ``context_parallel_dim`` and ``expert_parallel_dim`` (1
    where a recipe's config has no such key). Logs the layout on rank 0. A collective.

    Args:
        cfg (DictConfig): the recipe config.
        device (torch.device): the device the run trains on.

    Returns:
        ParallelDims: world size, rank, meshes, data-parallel rank and size, tensor- and expert-parallel layout.

    Raises:
        ConfigError: at the key whose value cannot be used (a backend the platform lacks, a tensor- or
            expert-parallel size that does not divide the world size).
    """
    import torch.distributed as dist

    from tune import training
    from tune.utils import log_rank_zero

    backend = cfg.dist_backend
    if backend is None and device.type == "cuda":
        backend = "cuda:nccl,cpu:gloo"  # NCCL for the model's tensors, gloo for CPU-side state (DCP)
    with errors_at("dist_backend", backend):
        training.init_distributed(backend)
    world_size, rank = dist.get_world_size(), dist.get_rank()
    tp_dim = cfg.tensor_parallel_dim if "tensor_parallel_dim" in cfg else 1
    cp_dim = cfg.context_parallel_dim if "context_parallel_dim" in cfg else 1
    tp_fits = isinstance(tp_dim, int) and not isinstance(tp_dim, bool) and tp_dim >= 1 and world_size % tp_dim == 0
    key, value = ("context_parallel_dim", cp_dim) if tp_fits else ("tensor_parallel_dim", tp_dim)
    with errors_at(key, value):  # the key whose value does not fit the world size
        mesh = training.init_device_mesh(world_size, tp_dim, device.type, context_parallel_dim=cp_dim)
    ep_dim = cfg.expert_parallel_dim if "expert_parallel_dim" in cfg else 1
    ep_mesh = None  # expert parallelism: groups of expert_parallel_dim ranks, each holding whole experts
    if ep_dim > 1:
        with errors_at("expert_parallel_dim", ep_dim):
            ep_mesh = training.init_expert_parallel_mesh(world_size, ep_dim, device.type)
    dp_rank, dp_size = training.data_parallel_rank_and_size(mesh)
    dims = training.ParallelDims(
        world_size=world_size,
        rank=rank,
        mesh=mesh,
        dp_rank=dp_rank,
        dp_size=dp_size,
        tp_size=training.tensor_parallel_size(mesh),
        ep_mesh=ep_mesh,
        cp_size=cp_dim,
    )
    log_rank_zero(
        log,
        f"{world_size} processes: {dp_size} data-parallel shard(s) x {cp_dim} context-parallel x {dims.tp_size} "
        "tensor-parallel rank(s), "
        f"{ep_dim} expert-parallel, backend {dist.get_backend()}.",
    )
    return dims


def shard_model(cfg: DictConfig, model: Any, dims: "ParallelDims", model_family: str | None) -> None:
    """Shards ``model`` with FSDP2 over the data-parallel ranks as a distributed recipe's config asks.

    Reads ``fsdp_cpu_offload``, ``fsdp_reshard_after_forward`` and ``fsdp_mixed_precision`` (``param_dtype``,
    ``reduce_dtype``, default fp32 reductions). The FSDP units follow the model family's rule
    (:func:`tune.training.family_shard_conditions`); expert-parallel experts become units of their own over the
    ranks that hold them.

    Args:
        cfg (DictConfig): the recipe config.
        model (nn.Module): the model, built on the meta device (and parallelised by tensor or expert parallelism).
        dims (ParallelDims): the run's layout (:func:`init_parallel`).
        model_family (str | None): the family whose sharding rule applies (the checkpointer's ``model_family``).
    """
    from tune import training
    from tune.utils import get_dtype

    mixed_precision = cfg.fsdp_mixed_precision or {}
    training.shard_model(
        model,
        training.family_shard_conditions(model, model_family),
        cpu_offload=cfg.fsdp_cpu_offload,
        reshard_after_forward=cfg.fsdp_reshard_after_forward,
        param_dtype=get_dtype(mixed_precision["param_dtype"]) if mixed_precision.get("param_dtype") else None,
        reduce_dtype=get_dtype(mixed_precision.get("reduce_dtype", "fp32")),
        dp_mesh=training.fsdp_mesh(dims.mesh),
        expert_mesh=dims.ep_mesh,
    )


def _recipe_state_settings(cfg: DictConfig, adapter_config: Any) -> dict[str, Any]:
    # the settings of the recipe state a training config holds
    settings = {
        "epochs": cfg.epochs,
        "max_steps_per_epoch": cfg.max_steps_per_epoch,
        "samples_per_step": cfg.batch_size * cfg.gradient_accumulation_steps,  # per data-parallel rank
        "adapter_config": adapter_config,
    }
    if adapter_config is not None:
        settings["save_adapter_weights_only"] = cfg.save_adapter_weights_only
    return settings


def recipe_state(cfg: DictConfig, model: Any, optimizer: Any, *, adapter_config: Any = None, **objects: Any) -> Any:
    """The :class:`tune.training.RecipeState` of a single-device recipe: the run's objects, and its length and
    save settings from the config (``epochs``, ``max_steps_per_epoch``, ``batch_size`` x
    ``gradient_accumulation_steps`` samples per step, ``save_adapter_weights_only`` for a LoRA model).

    Args:
        cfg (DictConfig): the recipe config.
        model (nn.Module): the model being trained.
        optimizer (Any): its optimizer.
        adapter_config (Any): the LoRA model's adapter config, or None.
        **objects (Any): ``checkpointer``, ``sampler``, ``seed``, ``steps_per_epoch``, ``lr_scheduler`` and, where
            the recipe has one, ``finetuning_schedule``.

    Returns:
        RecipeState: what the recipe's saves write and its resume restores.
    """
    from tune import training

    return training.RecipeState(model, optimizer, **objects, **_recipe_state_settings(cfg, adapter_config))


def sharded_recipe_state(
    cfg: DictConfig, model: Any, optimizer: Any, *, adapter_config: Any = None, **objects: Any
) -> Any:
    """The :class:`tune.training.ShardedRecipeState` of a distributed recipe: :func:`recipe_state`'s settings, plus
    ``output_dir``, ``keep_last_n_checkpoints`` and ``resume_from_checkpoint`` for the sharded checkpoints.

    Args:
        cfg (DictConfig): the recipe config.
        model (nn.Module): the sharded model.
        optimizer (Any): its optimizer.
        adapter_config (Any): the LoRA model's adapter config, or None.
        **objects (Any): as for :func:`recipe_state`.

    Returns:
        ShardedRecipeState: what the recipe's saves write and its resume restores. A collective to build.
    """
    from tune import training

    return training.ShardedRecipeState(
        model,
        optimizer,
        output_dir=cfg.output_dir,
        keep_last_n_checkpoints=cfg.keep_last_n_checkpoints,
        resume_from_checkpoint=cfg.resume_from_checkpoint,
        **objects,
        **_recipe_state_settings(cfg, adapter_config),
    )
