"""The tune report (`profkit.tune/1`): the trajectory (objective per step), the winning command line, and best
vs baseline. Text for the terminal, Markdown (tune.md) and HTML (tune.html); tune.json is the loop's own."""

from __future__ import annotations

from typing import Any

from profkit.escape import document, terminal
from profkit.render.diff import verdict_sentence
from profkit.units import metric_value


def _changes(step: dict[str, Any]) -> str:
    cand = step.get("candidate")
    if not cand:
        return ""
    parts = [f"{c['flag']} {'(removed)' if c['to'] is None else c['to']}" for c in cand["changes"]]
    return f"{cand['rule']}: " + ", ".join(parts) + _predicted(cand)


def _predicted(cand: dict[str, Any]) -> str:
    """The model's prediction for a candidate, beside what it measured (tune.json's step)."""
    p = cand.get("predicted")
    if not p:
        return ""
    return (f" (predicted {p['predicted']:.4g}, range {p['low']:.4g}-{p['high']:.4g}, "
            f"{p['gain'] * 100:+.0f} %)")


def stop_text(doc: dict[str, Any]) -> str:
    """Why the loop stopped; a tune.json still saying "running" was left by a loop that is still going or
    was killed (a machine taken away, SIGKILL): what it measured up to then is all there is."""
    if doc.get("stopped") != "running":
        return str(doc.get("stopped"))
    return (f"not finished: tune.json was last written after run {doc.get('runs_used')} of {doc.get('budget')} "
            "(the loop is still running, or its process was killed)")


def _shown(doc: dict[str, Any]) -> dict[str, Any]:
    return {**doc, "stopped": stop_text(doc)}


def _verdict(doc: dict[str, Any]) -> str | None:
    """Best vs baseline in one line: the embedded diff's verdict, written from its rows."""
    return verdict_sentence(doc["diff"]) if doc.get("diff") else None


def render_tune_text(doc: dict[str, Any]) -> str:
    doc = _shown(doc)
    obj = doc["objective"]["name"]
    out = [f"profkit tune: objective {terminal(obj)} ({terminal(doc['objective']['better'])} is better), "
           f"{doc['runs_used']}/{doc['budget']} runs, profile {terminal(doc['profile'])}",
           f"stopped: {terminal(doc['stopped'])}", ""]
    noise = doc.get("noise") or {}
    if noise.get("spread_pct") is not None:
        out.append(f"noise: baseline runs {', '.join(f'{v:.4g}' for v in noise['baseline_runs'])} "
                   f"(spread {noise['spread_pct']:.1f} %)")
    out.append(f"  {'step':>4}  {'kind':10} {'objective':>10}  {'decision':9} what")
    for s in doc["steps"]:
        value = "-" if s["objective"] is None else metric_value(obj, s["objective"])
        out.append(f"  {s['step']:>4}  {terminal(s['kind']):10} {value:>10}  {terminal(s['decision']):9} "
                   f"{terminal(_changes(s) or s['why'])}")
        if s["candidate"]:
            out.append(f"  {'':>4}  {'':10} {'':>10}  {'':9} {terminal(s['why'])}")
    best = doc.get("best")
    if best:
        change = f" ({best['change_pct']:+.1f} % vs the baseline)" if best["change_pct"] is not None else ""
        out += ["", f"best {terminal(obj)}: {metric_value(obj, best['best'])}{change}", "winning command line:"]
        out += [f"  {terminal(c)}" for c in best["commands"]]
    verdict = _verdict(doc)
    if verdict is not None:
        out += ["", "best vs baseline: " + terminal(verdict)]
    return document("\n".join(out) + "\n")


def render_tune_markdown(doc: dict[str, Any]) -> str:
    from profkit.render import markdown

    env = markdown.environment()
    env.filters.update(metric=metric_value, changes=_changes)
    return document(env.get_template("tune.md.j2").render(d=_shown(doc), verdict=_verdict(doc)))


def render_tune_html(doc: dict[str, Any]) -> str:
    import jinja2

    from profkit.render import charts, html

    env = html.environment()
    env.filters.update(metric=metric_value, changes=_changes)
    chart = jinja2.filters.Markup(charts.trajectory_chart(doc)) if doc["steps"] else ""
    return document(env.get_template("tune.html.j2").render(d=_shown(doc), verdict=_verdict(doc), chart=chart))
