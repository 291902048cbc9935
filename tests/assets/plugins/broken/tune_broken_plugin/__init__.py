"""Fixture: a plugin that fails to import. tune must warn once, naming it and the error, and carry on."""

raise RuntimeError("this plugin is broken on purpose")
