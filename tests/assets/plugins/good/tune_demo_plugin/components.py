def repeat(text: str, times: int = 2) -> str:
    """A plugin component: `_component_: demo_repeat` in a config."""
    return text * times
