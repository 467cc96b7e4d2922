"""A checkpoint is read whole before a resume changes anything: a truncated or corrupt file is
named in one line, whatever its kind (torch archive, safetensors, JSON)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from grpo_plugin.run import integrity


@pytest.fixture
def folder(tmp_path):
    """A checkpoint's kinds of files, each whole."""
    out = tmp_path / "checkpoint-4"
    out.mkdir()
    torch.save({"state": {0: {"exp_avg": torch.arange(64.0)}}}, out / "optimizer.pt")
    torch.save({"python": 1}, out / "rng_state.pth")
    save_file({"w": torch.ones(16)}, out / "adapter_model.safetensors")
    (out / "trainer_state.json").write_text(json.dumps({"global_step": 4}))
    (out / "README.md").write_text("not checked")
    return out


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _flip(path, at):
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_whole_checkpoint_passes(folder):
    assert integrity.first_damaged(folder) is None
    integrity.check_folder(folder, "fix it")  # no error


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("optimizer.pt", "its archive is cut short or corrupt"),
        ("rng_state.pth", "its archive is cut short or corrupt"),
        ("adapter_model.safetensors", "it holds 64 bytes where its header describes 128"),
        ("trainer_state.json", "it is not valid JSON"),
    ],
)
def test_a_truncated_file_is_named(folder, name, expected):
    _truncate(folder / name)
    with pytest.raises(integrity.DamagedCheckpoint) as caught:
        integrity.check_folder(folder, "resume from checkpoint-2.")
    message = str(caught.value)
    assert message.startswith(f"{folder / name} is damaged: {expected}")
    assert message.endswith("Nothing was changed; resume from checkpoint-2.")
    assert "\n" not in message


def test_a_flipped_byte_in_a_torch_archive_fails_its_checksum(folder):
    """torch.load does not check the CRCs: such a file resumed silently before."""
    data = (folder / "optimizer.pt").read_bytes()
    _flip(folder / "optimizer.pt", data.index(torch.arange(64.0).numpy().tobytes()) + 100)
    found = integrity.first_damaged(folder)
    assert found is not None and found[0].name == "optimizer.pt"
    assert "fails its checksum" in found[1]


def test_empty_and_foreign_files_are_damaged(folder):
    (folder / "scheduler.pt").write_bytes(b"")
    assert integrity.damage(folder / "scheduler.pt") == "it is empty"
    (folder / "scheduler.pt").write_bytes(b"<html>not found</html>")
    assert integrity.damage(folder / "scheduler.pt") == "it is not a torch archive"
    (folder / "x.safetensors").write_bytes(b"\x01\x00")
    assert integrity.damage(folder / "x.safetensors") == "it is shorter than a safetensors header"


def test_a_legacy_torch_file_is_not_refused(tmp_path):
    path = tmp_path / "old.pt"
    torch.save({"a": 1}, path, _use_new_zipfile_serialization=False)
    assert integrity.damage(path) is None  # a pickle: nothing to check it against


def test_a_folder_checked_whole_is_read_again_only_when_it_changed(folder, monkeypatch):
    assert integrity.first_damaged(folder) is None
    reads = []
    monkeypatch.setattr(integrity, "damage", lambda path: reads.append(path.name))
    assert integrity.first_damaged(folder) is None
    assert reads == []  # the same files, sizes and times: not read twice
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 5}))
    integrity.first_damaged(folder)
    assert "trainer_state.json" in reads
