"""torchtune's ``torchtune.training.<module>`` paths exist under ``tune.training`` with the names user code imports."""

import importlib

import pytest

PATHS = {
    "metric_logging": ["DiskLogger", "StdoutLogger", "TensorBoardLogger", "WandBLogger", "CometLogger", "MLFlowLogger"],
    "lr_schedulers": ["get_cosine_schedule_with_warmup", "get_lr"],
    "seed": ["set_seed"],
    "precision": ["PRECISION_STR_TO_DTYPE", "get_dtype", "set_default_dtype", "validate_expected_param_dtype"],
    "memory": [
        "DEFAULT_LOG_MESSAGE",
        "OptimizerInBackwardWrapper",
        "cleanup_before_training",
        "create_optim_in_bwd_wrapper",
        "get_memory_stats",
        "log_memory_stats",
        "register_optim_in_bwd_hooks",
        "set_activation_checkpointing",
    ],
    "activations": ["apply_selective_activation_checkpointing"],
    "quantization": ["get_quantizer_mode"],
    "pooling": ["get_unmasked_sequence_lengths"],
    "checkpointing._utils": ["ModelType", "FormattedCheckpointFiles", "get_largest_iter_folder", "MODEL_KEY"],
    "checkpointing._checkpointer": ["FullModelHFCheckpointer", "DistributedCheckpointer"],
}


@pytest.mark.parametrize("module", sorted(PATHS))
def test_torchtune_module_path_has_its_names(module):
    imported = importlib.import_module(f"tune.training.{module}")
    missing = [name for name in PATHS[module] if not hasattr(imported, name)]
    assert not missing, f"tune.training.{module} lacks {missing}"
