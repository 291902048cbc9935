"""torchtune's ``training.seed`` module path; the function lives in ``tune.training``."""

from tune.training._seed import set_seed

__all__ = ["set_seed"]
