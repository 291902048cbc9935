"""Key names of the dictionaries that recipes and checkpointers exchange (the same names as torchtune's)."""

# Top-level keys of the dict given to `save_checkpoint` and returned by `load_checkpoint`.
MODEL_KEY = "model"
ADAPTER_KEY = "adapter"
ADAPTER_CONFIG = "adapter_config"
RECIPE_STATE_KEY = "recipe_state"

# Keys of the recipe state (`recipe_state.pt`).
OPT_KEY = "optimizer"
LR_SCHEDULER_KEY = "lr_scheduler"
SEED_KEY = "seed"
EPOCHS_KEY = "epochs_run"
TOTAL_EPOCHS_KEY = "total_epochs"
MAX_STEPS_KEY = "max_steps_per_epoch"
STEPS_KEY = "steps_run"
DATALOADER_KEY = "dataloader"
RNG_KEY = "rng_state"

# File names inside a checkpoint directory.
RECIPE_STATE_FILE = "recipe_state.pt"
CONFIG_FILE = "config.yaml"
COMPLETE_MARKER = ".complete"
# The adapter goes in a subdirectory: transformers loading a directory holding both a full model and an adapter
# applies the adapter on top of the (already merged) weights.
ADAPTER_SUBDIR = "adapter"
ADAPTER_MODEL_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG_FILE = "adapter_config.json"
DOWNLOAD_RECORD_FILE = "tune_download.json"
SAFETENSORS_INDEX_FILE = "model.safetensors.index.json"
BIN_INDEX_FILE = "pytorch_model.bin.index.json"
