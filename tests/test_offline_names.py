""""offline" means one thing: no network (HF_HUB_OFFLINE). The recipe's shipped sample is
data.source=local (a recipe source's `local:`), training from harvest shards is
train.mode=stored. The old names still work for one release, each with one deprecation line."""

from __future__ import annotations

import pytest
import yaml

from draftkit.core import config
from draftkit.core.config import RunConfig
from draftkit.prepare import recipes


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(config, "_warned", set())


def test_defaults_use_the_new_names():
    cfg = RunConfig()
    assert cfg.train.mode == "stored" and cfg.data.source == "hub"


def test_old_values_in_overrides_and_files_still_work_with_one_line(tmp_path, capsys):
    path = tmp_path / "draftkit.yaml"
    path.write_text(yaml.safe_dump({"data": {"source": "offline"},
                                    "train": {"mode": "offline"}}))
    cfg = config.load(path)
    assert (cfg.data.source, cfg.train.mode) == ("local", "stored")
    err = capsys.readouterr().err
    assert "data.source=offline is deprecated, use data.source=local" in err
    assert "train.mode=offline is deprecated, use train.mode=stored" in err
    cfg = config.load(path, ["train.mode=offline"])  # once per process and name
    assert cfg.train.mode == "stored" and capsys.readouterr().err == ""
    assert config.load(path, ["train.mode=online"]).train.mode == "online"
    new = config.load(path, ["data.source=local", "train.mode=stored"])
    assert (new.data.source, new.train.mode) == ("local", "stored")


def test_a_recipe_with_the_old_offline_key_loads_as_local(tmp_path, capsys):
    text = (recipes.recipes_dir() / "math.yaml").read_text()
    assert "\n    local: {" in text and "offline:" not in text
    old = tmp_path / "old.yaml"
    old.write_text(text.replace("local: {", "offline: {"))
    new = recipes.load_recipe(str(recipes.recipes_dir() / "math.yaml"))
    got = recipes.load_recipe(str(old))
    assert got.sources[0].local == new.sources[0].local and got.sources[0].local.mathgen == "train"
    assert "sources[0].offline is deprecated, use sources[0].local" in capsys.readouterr().err
