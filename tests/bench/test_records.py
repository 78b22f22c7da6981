"""Run records: a row's commit says whether code differed from it, and rows append whole."""

from __future__ import annotations

import subprocess
from pathlib import Path

from vitkit.bench.records import RESULTS, append_row, git_commit, read_rows


def _git(repo: Path, *args: str) -> str:
    command = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args]
    return subprocess.run(command, cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


def test_the_commit_is_dirty_for_changed_code_and_not_for_appended_rows(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # tmp_path is in no repository, wherever it is
    repo = tmp_path / "repo"
    (repo / RESULTS).mkdir(parents=True)
    (repo / "src").mkdir()
    (repo / "src" / "code.py").write_text("x = 1\n")
    (repo / RESULTS / "bench.jsonl").write_text('{"a": 1}\n')
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "first")
    head = _git(repo, "rev-parse", "--short", "HEAD")
    assert git_commit(repo / "src") == head
    append_row(repo / RESULTS / "bench.jsonl", {"b": 2}, command=["bench"])  # a queue's earlier row
    assert git_commit(repo / "src") == head
    (repo / "src" / "code.py").write_text("x = 2\n")
    assert git_commit(repo / "src") == head + "+dirty"
    (repo / "src" / "new.py").write_text("untracked\n")  # untracked files do not count
    (repo / "src" / "code.py").write_text("x = 1\n")
    assert git_commit(repo) == head
    assert git_commit(tmp_path) == ""  # outside a git tree


def test_rows_append_in_order_with_their_context(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"first": true}')  # a file without its last newline
    row = append_row(path, {"top1": 0.5}, command=["bench", "--x"], config_changes=["a.b=1"])
    rows = read_rows(path)
    assert rows == [{"first": True}, row] and rows[1]["top1"] == 0.5
    assert rows[1]["command"] == "bench --x" and rows[1]["config_changes"] == ["a.b=1"]
    assert {"date", "commit", "cpu", "isa", "native_bf16", "threads", "torch"} <= rows[1].keys()


def test_a_row_names_the_commit_its_process_started_from(tmp_path: Path, monkeypatch) -> None:
    """A benchmark may write its row an hour after it started; the checkout may have moved on by then."""
    from vitkit.bench import records

    monkeypatch.setattr(records, "git_commit", lambda cwd=None: "moved-on")
    row = append_row(tmp_path / "r.jsonl", {}, command=["bench"])
    assert row["commit"] == records.COMMIT != "moved-on"
