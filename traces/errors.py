"""The one exception type for a user's mistake.

Every package raises `ConfigError` for bad input (a config value, a flag, a file); the CLI turns
it into one line on stderr and exit status 2. Internal invariants use `assert` instead.
"""


class ConfigError(ValueError):
    """Bad user input; the message names the field, the value and the rule."""
