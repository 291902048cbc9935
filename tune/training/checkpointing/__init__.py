"""Checkpointing: Hugging Face, Meta and native formats, PEFT adapters, DCP for sharded state, atomic layout,
resumable sampler and recipe state (optimizer, LR schedule, progress, data position, RNG states), and export of a
checkpoint as one merged Hugging Face directory or GGUF file (``tune export``)."""

from tune.training.checkpointing._checkpointer import (
    FullModelHFCheckpointer,
    FullModelMetaCheckpointer,
    FullModelTorchTuneCheckpointer,
)
from tune.training.checkpointing._constants import (
    ADAPTER_CONFIG,
    ADAPTER_KEY,
    DATALOADER_KEY,
    EPOCHS_KEY,
    LR_SCHEDULER_KEY,
    MAX_STEPS_KEY,
    MODEL_KEY,
    OPT_KEY,
    RECIPE_STATE_KEY,
    RNG_KEY,
    SEED_KEY,
    STEPS_KEY,
    TOTAL_EPOCHS_KEY,
)
from tune.training.checkpointing._distributed import DistributedCheckpointer, gather_full_state_dict
from tune.training.checkpointing._export import (
    HF_EXPORT_DTYPES,
    ExportSource,
    export_hf,
    missing_inference_files,
    open_checkpoint,
    resolve_checkpoint,
)
from tune.training.checkpointing._formats import (
    adapter_to_peft,
    hf_to_meta,
    merge_adapter,
    meta_to_hf,
    peft_to_adapter,
    permute_hf_to_meta,
    permute_meta_to_hf,
    split_adapter,
)
from tune.training.checkpointing._gguf import GGUF_ARCHITECTURES, GGUF_EXPORT_DTYPES, export_gguf
from tune.training.checkpointing._io import (
    CheckpointError,
    CheckpointSaveError,
    load_safetensors,
    load_weights_file,
    safe_torch_load,
)
from tune.training.checkpointing._layout import (
    checkpoint_dir_name,
    find_earlier_run,
    find_latest_checkpoint,
    list_complete_checkpoints,
    move_earlier_run_aside,
    prune_checkpoints,
    should_save_checkpoint,
)
from tune.training.checkpointing._model_io import load_adapter_weights
from tune.training.checkpointing._sampler import StatefulDistributedSampler
from tune.training.checkpointing._state import (
    config_to_yaml,
    get_rng_state,
    load_recipe_state,
    save_config,
    save_recipe_state,
    set_rng_state,
)
from tune.training.checkpointing._utils import (
    FormattedCheckpointFiles,
    ModelType,
    get_largest_iter_folder,
    update_state_dict_for_classifier,
)

# torchtune's name for "any of the checkpointers", used in type annotations
Checkpointer = (
    FullModelHFCheckpointer | FullModelMetaCheckpointer | FullModelTorchTuneCheckpointer | DistributedCheckpointer
)

__all__ = [
    "Checkpointer",
    "ExportSource",
    "GGUF_ARCHITECTURES",
    "GGUF_EXPORT_DTYPES",
    "HF_EXPORT_DTYPES",
    "export_gguf",
    "export_hf",
    "missing_inference_files",
    "open_checkpoint",
    "resolve_checkpoint",
    "CheckpointError",
    "CheckpointSaveError",
    "ADAPTER_CONFIG",
    "ADAPTER_KEY",
    "DATALOADER_KEY",
    "DistributedCheckpointer",
    "FormattedCheckpointFiles",
    "EPOCHS_KEY",
    "FullModelHFCheckpointer",
    "FullModelMetaCheckpointer",
    "FullModelTorchTuneCheckpointer",
    "LR_SCHEDULER_KEY",
    "MAX_STEPS_KEY",
    "MODEL_KEY",
    "ModelType",
    "OPT_KEY",
    "RECIPE_STATE_KEY",
    "RNG_KEY",
    "SEED_KEY",
    "STEPS_KEY",
    "StatefulDistributedSampler",
    "TOTAL_EPOCHS_KEY",
    "adapter_to_peft",
    "checkpoint_dir_name",
    "config_to_yaml",
    "find_earlier_run",
    "find_latest_checkpoint",
    "gather_full_state_dict",
    "get_largest_iter_folder",
    "get_rng_state",
    "hf_to_meta",
    "list_complete_checkpoints",
    "load_adapter_weights",
    "load_recipe_state",
    "load_safetensors",
    "load_weights_file",
    "merge_adapter",
    "move_earlier_run_aside",
    "meta_to_hf",
    "peft_to_adapter",
    "permute_hf_to_meta",
    "permute_meta_to_hf",
    "prune_checkpoints",
    "safe_torch_load",
    "save_config",
    "save_recipe_state",
    "set_rng_state",
    "should_save_checkpoint",
    "split_adapter",
    "update_state_dict_for_classifier",
]
