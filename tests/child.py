"""What the Ctrl-C tests' children start with: SIGINT at its default, as under a terminal.

A shell's background job (`cmd &` without job control) starts with SIGINT ignored, and an
ignored signal stays ignored across exec, so a suite run that way would send its Ctrl-C to
children that never see it. `preexec_fn=sigint_default` gives them what a user's shell gives.
"""

import signal


def sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
