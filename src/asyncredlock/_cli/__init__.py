"""The subcommands of the ``asyncredlock`` command line (parsed in ``__main__``)."""
