"""Fixture recipe without RECIPE_INFO: listed, runs no config, refuses torchrun flags."""

import sys

if __name__ == "__main__":
    sys.exit(0)
