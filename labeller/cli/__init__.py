"""The command line: the root command, its lazy command table and the one-shot commands."""
