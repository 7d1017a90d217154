"""The one exception type for a user's mistake.

Every package raises `ConfigError` for bad input (a config value, a flag, a file); the CLI turns
it into one line on stderr and exit status 2. Internal invariants use `assert` instead.
"""

from collections.abc import Iterable, Sequence


class ConfigError(ValueError):
    """Bad user input; the message names the field, the value and the rule."""


def check_keys(table: Iterable[str], known: Sequence[str], where: str) -> None:
    """Reject keys of a config table that are not in `known`, naming the first one."""
    for key in table:
        if key not in known:
            raise ConfigError(f"{where}.{key}: unknown key (known: {', '.join(known)})")
