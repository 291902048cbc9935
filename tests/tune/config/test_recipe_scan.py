"""tune/config/_recipe_scan.py: what a recipe reads from its config and passes to instantiate, found with ast."""

import inspect
import textwrap

from tune.config._recipe_scan import RuntimeArgs, scan_recipe

RECIPE = """
import sys
from functools import partial
from tune import config
from tune.datasets import alpaca_dataset as my_alias


class Recipe:
    def __init__(self, cfg):
        self._device = cfg.device
        self._log_every = cfg["log_every_n_steps"]
        self._compile = cfg.get("compile", False)          # optional: a get
        if cfg.get("profiler"):                             # guarded: reads below are optional
            self._profile = cfg.profiler.enabled
        self._seed = cfg.seed if "seed" in cfg else None
        flag = cfg.get("extra") and cfg.extra.value          # guarded by `and`
        cfg.written_here = 1                                 # a store, not a read

    def setup(self, cfg):
        self._model = self._setup_model(cfg.model)
        self._optimizer = self._setup_optimizer(cfg_optimizer=cfg.optimizer)
        self._data = self._setup_data(cfg.dataset, batch_size=cfg.batch_size)
        if cfg.get("dataset_val") is not None:
            self._val = self._setup_data(cfg.dataset_val, batch_size=cfg.batch_size)
        self._cfg = cfg
        self._loss = config.instantiate(self._cfg.loss)
        self._sched = self._setup_lr_scheduler(cfg.get("lr_scheduler"))

    def _setup_model(self, cfg_model):
        model = config.instantiate(cfg_model)
        rank = cfg_model.lora_rank
        return model

    def _setup_optimizer(self, cfg_optimizer):
        return config.instantiate(cfg_optimizer, self._model.parameters())

    def _setup_data(self, cfg_dataset, batch_size):
        if isinstance(cfg_dataset, list):
            parts = [config.instantiate(one, tokenizer=self._tok) for one in cfg_dataset]
            for single in cfg_dataset:
                config.instantiate(single, tokenizer=self._tok, split="train")
        packed = cfg_dataset.get("packed", False)
        return config.instantiate(cfg_dataset, self._tok)

    def _setup_lr_scheduler(self, cfg_lr_scheduler):
        if cfg_lr_scheduler is None:
            return None
        extra = {"last_epoch": -1}
        return config.instantiate(cfg_lr_scheduler, self._optimizer, **extra)

    def checkpointer(self):
        return config.instantiate(cfg_checkpointer)      # a name only known by the cfg_<key> convention


def build_thing(size, *, scale=1.0, **rest):
    return size


class Thing:
    def __init__(self, a, b=2):
        pass


@config.parse
def recipe_main(cfg):
    recipe = Recipe(cfg=cfg)
    recipe.setup(cfg=cfg)
"""


def _scan(tmp_path):
    path = tmp_path / "recipe.py"
    path.write_text(textwrap.dedent(RECIPE))
    return scan_recipe(path)


def test_required_reads_follow_aliases_and_skip_guarded_and_optional_ones(tmp_path):
    reads = {".".join(path) for path in _scan(tmp_path).reads}
    assert reads == {
        "device",
        "log_every_n_steps",
        "model",
        "model.lora_rank",
        "optimizer",
        "dataset",
        "batch_size",
        "loss",
    }


def test_runtime_arguments_per_instantiated_node(tmp_path):
    args = _scan(tmp_path).runtime_args
    assert args[("model",)] == RuntimeArgs()
    assert args[("optimizer",)] == RuntimeArgs(num_positional=1)
    assert args[("loss",)] == RuntimeArgs()  # through `self._cfg = cfg`
    # the dataset node: positionally as a whole, by keyword per list item
    assert args[("dataset",)] == RuntimeArgs(num_positional=1)
    assert args[("dataset", "*")] == RuntimeArgs(keywords={"tokenizer", "split"})
    assert args[("dataset_val",)] == RuntimeArgs(num_positional=1)
    assert args[("lr_scheduler",)] == RuntimeArgs(num_positional=1, open_ended=True)  # **extra
    assert args[("checkpointer",)] == RuntimeArgs()


def test_module_level_definitions_and_imports(tmp_path):
    scan = _scan(tmp_path)
    P = inspect.Parameter
    build = scan.definitions["build_thing"].parameters
    assert [(name, p.kind) for name, p in build.items()] == [
        ("size", P.POSITIONAL_OR_KEYWORD),
        ("scale", P.KEYWORD_ONLY),
        ("rest", P.VAR_KEYWORD),
    ]
    assert build["size"].default is P.empty and build["scale"].default is not P.empty
    thing = scan.definitions["Thing"]
    assert list(thing.parameters) == ["a", "b"]  # self dropped
    assert thing.parameters["a"].default is inspect.Parameter.empty
    assert thing.parameters["b"].default is not inspect.Parameter.empty
    assert scan.definitions["Recipe"] is not None and "a" not in scan.definitions["Recipe"].parameters
    assert scan.imports["my_alias"] == "tune.datasets.alpaca_dataset"


def test_a_helper_taking_a_parameter_named_cfg_does_not_rebase_every_read(tmp_path):
    path = tmp_path / "r.py"
    path.write_text(
        "def build(cfg):\n    return instantiate(cfg)\n\ndef main(cfg):\n    build(cfg.model)\n    return cfg.epochs\n"
    )
    scan = scan_recipe(path)
    assert set(scan.reads) == {("model",), ("epochs",)}
    assert ("model", "epochs") not in scan.reads
