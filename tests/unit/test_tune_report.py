"""``naiad tune``'s choice among measured settings: speed within the shuffle quality bar."""

from __future__ import annotations

from naiad.cli.tune_report import (
    CORR_AIM,
    SPAN_AIM,
    Measurement,
    QualityBar,
    Setting,
    defaults_report,
    quality_bar,
    recommend,
)


def m(rows_per_s: float, *, block: int | None = None, workers: int = 0, corr: float | None = 0.0,
      span: float | None = 0.995) -> Measurement:
    setting = Setting(workers, "thread" if workers else "inline", 2 if workers else None, block)
    return Measurement(setting, rows_per_s, 0.1, 100.0, 300.0, 0.1, 100, corr, span)


def test_a_faster_setting_that_mixes_less_is_named_but_not_recommended() -> None:
    defaults = m(1.0e6)
    coarse = m(1.2e6, block=4 << 20, corr=0.004, span=0.92)
    threads = m(1.02e6, workers=2)
    results = [defaults, threads, coarse]
    bar = quality_bar(defaults.corr, defaults.span, 1024)
    assert bar == QualityBar(CORR_AIM, round(SPAN_AIM * 1023 / 1025, 4)) == QualityBar(0.02, 0.9781)
    chosen = recommend(results, bar)
    assert chosen is defaults  # the cheapest within 5% of the best that mixes well
    lines, todo = defaults_report(results, defaults, chosen, "naiad.DataLoader(...)", 65536, 131072, bar)
    assert todo == [] and any("nothing to change" in line for line in lines)
    named = [line for line in lines if line.startswith("Faster but mixing less")]
    assert len(named) == 1 and "block_bytes=4194304" in named[0] and "0.920" in named[0] and "1.20x" in named[0]

    # Without a bar (--any-order), speed alone: the coarse setting, and the defaults reach 0.83x.
    assert recommend(results, None) is coarse
    lines, todo = defaults_report(results, defaults, coarse, "naiad.DataLoader(...)", 65536, 131072, None)
    assert [c["option"] for c in todo] == ["block_bytes"] and any("0.83x" in line for line in lines)
    assert not any(line.startswith("Faster but mixing less") for line in lines)


def test_the_bar_relaxes_to_defaults_that_miss_the_aim_and_unknown_figures_pass() -> None:
    defaults = m(1.0e6, corr=-0.05, span=0.9)
    bar = quality_bar(defaults.corr, defaults.span, 1024)
    assert bar == QualityBar(0.06, 0.89)  # the defaults' figures, less the slack
    as_good = m(1.1e6, workers=1, corr=0.04, span=0.95)
    worse = m(1.5e6, block=8 << 20, corr=0.2, span=0.5)
    assert recommend([defaults, as_good, worse], bar) is as_good
    # A map-style dataset has no figures: nothing is excluded.
    memory = [m(1.0e6, corr=None, span=None), m(2.0e6, workers=1, corr=None, span=None)]
    assert recommend(memory, quality_bar(None, None, 1024)) is memory[1]
    # When nothing meets the bar, the fastest of all (there is no better order to keep).
    assert recommend([worse], bar) is worse
