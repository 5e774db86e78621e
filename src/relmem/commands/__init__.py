"""Thin ``relmem`` sub-commands: parse arguments, call the library, set the exit status."""
