"""The bound on one collective's lowering, checked before it is built: its flows are lists of
links per channel, so memory and the max-min sharing's time grow with channels x ranks. A
GB200 NVL72 collective over 1,820 racks (131,040 GPUs, 72 channels: 9.4 M rank-channels,
~20 M link entries) ran past 300 s at 4.4 GB; DGX H100 with the same GPUs (16 channels,
2.1 M) takes 58 s at 0.8 GB (issue 36's sweep)."""

from __future__ import annotations

from traces.errors import ConfigError

MAX_RANK_CHANNELS = 2**22
"""4,194,304: twice the DGX H100 case above, a minute or two and ~2 GB."""


def check_lowering_size(ranks: int, channels: int) -> None:
    """Refuse a collective over `ranks` whose `channels` make it too big to lower."""
    if ranks * channels > MAX_RANK_CHANNELS:
        raise ConfigError(f"collective: {ranks:,} ranks x {channels} channels = "
                          f"{ranks * channels:,} rank-channels, more than the "
                          f"{MAX_RANK_CHANNELS:,} parasim's flow model lowers (its memory and "
                          "time grow with them); use fewer nodes")
