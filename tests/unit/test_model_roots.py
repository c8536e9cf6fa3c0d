from pathlib import Path

import pytest

from inferd.catalog.roots import ModelRoots, is_local_path
from inferd.errors import Forbidden


def test_roots_for_every_project_and_for_one(tmp_path: Path) -> None:
    shared, team = tmp_path / "shared", tmp_path / "team"
    roots = ModelRoots.parse(f"{shared}, team={team}")
    roots.check(str(shared / "m"), "team")
    roots.check(str(team / "m"), "team")
    roots.check(str(shared / "m"), "other")
    with pytest.raises(Forbidden) as refused:
        roots.check(str(team / "m"), "other")
    assert str(team) not in refused.value.message  # not a root of 'other'
    # `..` and symbolic links are followed before the check.
    with pytest.raises(Forbidden):
        roots.check(f"{shared}/../team/m", "other")
    (tmp_path / "link").symlink_to(team)
    ModelRoots.parse(str(tmp_path / "link")).check(str(team / "m"), None)
    with pytest.raises(Forbidden):
        ModelRoots().check(str(shared), "team")
    with pytest.raises(ValueError, match="absolute"):
        ModelRoots.parse("relative/dir")


def test_local_paths_are_told_from_repository_ids() -> None:
    assert is_local_path("/srv/m") and is_local_path("./m") and is_local_path("~/m")
    assert not is_local_path("Qwen/Qwen2.5-0.5B-Instruct")


def test_a_relative_root_is_refused_at_start() -> None:
    from inferd.settings import SettingsError, load_settings

    with pytest.raises(SettingsError, match="model_roots"):
        load_settings(env={}, overrides={"model_roots": "team=models"})
    assert load_settings(env={}, overrides={"model_roots": "/srv/m"}).model_roots == "/srv/m"
