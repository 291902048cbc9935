class TuneError(Exception):
    """A mistake the user can fix (a bad name, path, override, config value or input file).

    The ``tune`` command and every recipe print its message as one ``error: ...`` line, without a Python
    traceback (``TUNE_DEBUG=1`` shows the traceback too). It lives in this leaf module so that every layer (a
    checkpointer in ``tune.training``, say) can raise it; ``tune.config.TuneError`` is the same class.
    """
