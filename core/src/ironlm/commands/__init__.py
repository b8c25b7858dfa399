"""Subcommands of the ``ironlm`` CLI, one module each."""
