"""The ``tune`` command: ``tune ls | cp | cat | run | validate | download`` (entry point ``tune._cli.main:main``)."""
