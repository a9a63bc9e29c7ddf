"""Arms of one benchmark process (``benchmarks/h200/controller.py run --within``): its windows split per arm, and
each arm compared with the process's own arm pair by pair.

A child run with ``--arm`` options alternates blocks of ABBA windows between its own controller options and
each arm's (:func:`arm_order`); every window records its arm (``"arm"``: the options, comma
separated; absent in older runs: the child's own). Split, each arm is a document of its own, labelled
``LABEL[OPTIONS]`` as a variant run in a process of its own would be; only the child's own arm keeps the
profiled window and the log. The comparison pairs each arm's i-th ABBA pair with the own arm's i-th (the same
round, the same place in its block, seconds apart): the difference of their overheads, in points, with
its 95% t interval, free of the spread between processes.
"""

from __future__ import annotations

from typing import Any


def arm_order(arms: list[list[str]], rounds: int) -> list[list[str]]:
    """The arms' blocks of ``controller_windows.ORDER`` windows in a child, round after round, each round starting
    one arm later (so no arm always follows the same one)."""
    return [arms[(round_ + k) % len(arms)] for round_ in range(rounds) for k in range(len(arms))]


def _arm(window: dict[str, Any]) -> str:
    return str(window.get("arm", ""))


def split_arms(document: dict[str, Any]) -> list[dict[str, Any]]:
    """``document`` per arm (see the module docstring); one arm: ``[document]``, unchanged."""
    arms = list(dict.fromkeys(map(_arm, document["windows"])))
    if len(arms) <= 1:
        return [document]
    own, parts = arms[0], []
    for arm in arms:
        windows = [w for w in document["windows"] if _arm(w) == arm]
        if arm == own:
            parts.append({**document, "windows": windows})
        else:
            parts.append({**document, "label": f"{document['label']}[{arm}]", "windows": windows, "profile": None,
                          "log": [], "within": document["label"]})
    return parts


def arm_differences(documents: list[dict[str, Any]], pair_overheads: dict[str, list[float]]) -> dict[str, Any]:
    """For each arm split from a process (:func:`split_arms`): its ABBA pairs' overheads (``pair_overheads`` by
    label, fractions) minus its process's own arm's, pair by pair, and which arm that is."""
    return {d["label"]: {"against": d["within"],
                         "differences": [a - b for a, b in zip(pair_overheads[d["label"]], pair_overheads[d["within"]],
                                                               strict=True)]}
            for d in documents if "within" in d}


def arm_lines(compared: dict[str, dict[str, Any]]) -> list[str]:
    """The comparison's markdown section (none without arms); each entry also has the differences' ``mean``
    and ``ci95``."""
    if not compared:
        return []
    lines = ["", "## Arms of one process against its own (`--within`: pair by pair, same round and place)", "",
             "| arm | against | overhead difference, mean of pairs [95% CI] (points) | per pair |",
             "| --- | --- | --- | --- |"]
    for label, c in compared.items():
        low, high = c["ci95"]
        pairs = ", ".join(f"{100 * d:+.2f}" for d in c["differences"])
        lines.append(f"| {label} | {c['against']} | {100 * c['mean']:+.2f} [{100 * low:+.2f}, {100 * high:+.2f}] "
                     f"| {pairs} |")
    return lines
