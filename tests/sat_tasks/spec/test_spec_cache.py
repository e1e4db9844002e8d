"""The parsed-spec cache: a spec file is read and validated once per version, in one process."""

from __future__ import annotations

import os

import pytest
import yaml

from sat_tasks.spec import SpecError, loading
from sat_tasks.spec.loading import clear_spec_cache, load_spec_cached
from tests.sat_tasks.spec.test_spec import BASE


@pytest.fixture
def reads(monkeypatch):
    """The files `load_spec` really read, in order."""
    clear_spec_cache()
    seen: list[str] = []
    real = loading.load_spec

    def counting(path):
        seen.append(os.path.basename(path))
        return real(path)

    monkeypatch.setattr(loading, "load_spec", counting)
    yield seen
    clear_spec_cache()


def _bump(path):
    """A new version of the file in the same size and second (what a fast editor may leave)."""
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))


def test_an_unchanged_file_is_read_once(tmp_path, reads):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(BASE))
    first = load_spec_cached(path)
    assert load_spec_cached(path) is first and load_spec_cached(str(path)) is first
    assert reads == ["job.yaml"]


def test_a_changed_file_is_read_again(tmp_path, reads):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(BASE))
    assert load_spec_cached(path).name == BASE["name"]
    path.write_text(yaml.safe_dump({**BASE, "name": "another-name"}))
    assert load_spec_cached(path).name == "another-name"
    _bump(path)
    load_spec_cached(path)
    assert reads == ["job.yaml"] * 3


def test_a_bad_file_raises_the_same_problems_each_time_from_one_read(tmp_path, reads):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**BASE, "name": "B"}))
    messages = []
    for _ in range(2):
        with pytest.raises(SpecError) as info:
            load_spec_cached(path)
        messages.append(str(info.value))
    assert messages[0] == messages[1] and messages[0].startswith(f"{path}: name: must be 3-63 chars")
    assert reads == ["bad.yaml"]


def test_a_missing_file_is_not_cached(tmp_path, reads):
    with pytest.raises(SpecError, match="cannot be read"):
        load_spec_cached(tmp_path / "gone.yaml")
    (tmp_path / "gone.yaml").write_text(yaml.safe_dump(BASE))
    assert load_spec_cached(tmp_path / "gone.yaml").name == BASE["name"]


def test_specs_are_parsed_with_libyaml_when_pyyaml_has_it():
    assert loading._YAML_LOADER is getattr(yaml, "CSafeLoader", yaml.SafeLoader)
