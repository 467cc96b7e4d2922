"""The run directory's writers: whole files or none, and a failed write names its file."""

from __future__ import annotations

import errno
import json
import pathlib

import pyarrow.parquet as pq
import pytest

from grpo_plugin.run import rundir


def test_a_completions_table_that_fails_half_way_leaves_no_file(tmp_path, monkeypatch):
    """A full disk while writing step_00003.parquet: no half table under the final name (a
    resume would read it), no temporary left behind, and the error names the table."""
    table = rundir.completions_file(tmp_path, 3)

    def full_disk(data, where, **kwargs):
        with open(where, "wb") as fh:
            fh.write(b"PAR1 half")
        raise OSError(errno.ENOSPC, "No space left on device")  # pyarrow's: no file named

    monkeypatch.setattr(pq, "write_table", full_disk)
    with pytest.raises(OSError) as caught:
        rundir.write_completions_parquet(table, {"completion": ["a"]})
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(table)
    assert list(table.parent.iterdir()) == []


def test_a_metrics_line_that_cannot_be_written_names_the_file(tmp_path, monkeypatch):
    class FullDisk:  # a buffered write on a full disk: the error names no file
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pathlib.Path, "open", lambda self, mode="r": FullDisk())
    with pytest.raises(OSError) as caught:
        rundir.append_metrics(tmp_path, 1, {"loss": 0.5})
    assert caught.value.filename == str(tmp_path / rundir.METRICS_FILE)


def test_metrics_split_at_a_step_keeps_everything_once(tmp_path):
    rows = [{"step": 1}, {"step": 2}, {"step": 2, "train_runtime": 3.0}, {"step": 3}]
    text = "".join(json.dumps(r) + "\n" for r in rows) + "\n" + '{"step": 4, "lo'
    (tmp_path / rundir.METRICS_FILE).write_text(text)
    kept, later = rundir.split_metrics(tmp_path, 2)
    assert [json.loads(line) for line in kept] == rows[:2]
    assert later[:2] == [json.dumps(rows[2]), json.dumps(rows[3])]
    assert later[2] == '{"step": 4, "lo'  # cut short by a kill: kept aside as it is
    assert rundir.split_metrics(tmp_path / "none", 2) == ([], [])


def test_only_our_tables_have_a_step():
    step = rundir.completion_step
    assert step(pathlib.Path("step_00012.parquet")) == 12
    assert step(pathlib.Path(".step_00012.parquet-123-ab")) is None  # a temporary
    assert step(pathlib.Path("notes.parquet")) is None
