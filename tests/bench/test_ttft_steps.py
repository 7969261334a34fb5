"""bench/ttft_steps.py's reading of the server's marks, and the step table of the report."""

from __future__ import annotations

from bench.ttft_report import DbRun, _steps_lines
from bench.ttft_steps import STEPS, steps_marks, steps_medians

MS = 1_000_000


def test_marks_are_grouped_per_send_and_read_after_the_client_sent(tmp_path):
    log = tmp_path / "steps.log"
    # Two sends; the second's model was never called (a refusal, say): its steps are missing,
    # not read from the first's.
    log.write_text(
        "\n".join(
            [
                f"arrived {1 * MS}",
                f"view {3 * MS}",
                f"model {6 * MS}",
                f"out {9 * MS}",
                f"arrived {101 * MS}",
                f"view {105 * MS}",
                f"out {111 * MS}",
            ]
        )
    )
    marks = steps_marks(log)
    assert [sorted(m) for m in marks] == [
        ["arrived", "model", "out", "view"],
        ["arrived", "out", "view"],
    ]
    medians = steps_medians([(0, 10 * MS, marks[0]), (100 * MS, 112 * MS, marks[1])])
    assert medians["arrived"] == 1.0
    assert medians["view"] == 4.0  # 3 and 5 ms after sending
    assert medians["model"] == 6.0  # the first send's alone
    assert medians["out"] == 10.0
    assert medians["received"] == 11.0
    assert "headers" not in medians


def test_the_report_gives_when_each_step_was_reached_and_what_it_took():
    run = DbRun(label="SQLite", steps={"fresh": {"arrived": 1.0, "view": 2.5, "received": 8.0}})
    lines = _steps_lines(run)
    assert lines[0] == "| step | fresh: at ms | fresh: took ms |"
    rows = {line.split(" | ")[0].lstrip("| "): line for line in lines[2:]}
    assert rows[STEPS[0][1]].endswith("| 1.0 | 1.0 |")
    assert rows[STEPS[1][1]].endswith("| 2.5 | 1.5 |")
    assert rows[STEPS[2][1]].endswith("| - | - |")
    assert rows["first delta at the client"].endswith("| 8.0 | 5.5 |")  # since the view
