"""The HTML report of one simulated step, for someone planning a cluster run.

    parasim simulate CONFIG.toml --report step.html [--report-ranks 0,64]

    from sim.report import write_report
    summary, times = predict(exp)
    write_report("step.html", exp, summary, times)          # ranks=[0, 64]: lanes to detail

One self-contained, deterministic file (`page`): the headline figures; the pipeline view
(`pipeline`: F/B per micro-batch per stage at the simulated times, the bubble drawn); where the
time goes (`breakdown`: MFU waterfall, per-rank split, per-stream and per-collective tables,
`collectives`); the lanes of chosen ranks as busy fractions re-binned on zoom (`lanes`);
memory over time and at the peak (`memory_view`). Words follow the cluster and the folding
(`words`). What is drawn is read off the timed ops by `sim.report.timeline`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sim.report.page import read_payload, render_report, write_report

__all__ = ["read_payload", "render_report", "write_report"]


def __getattr__(name: str) -> Any:
    # plotly loads with the page, on first use: `sim.report.words` (which `parasim search`
    # shares) imports without it
    if name in __all__:
        from sim.report import page

        return getattr(page, name)
    raise AttributeError(f"module 'sim.report' has no attribute {name!r}")
