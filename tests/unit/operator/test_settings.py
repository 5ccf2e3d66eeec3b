"""The operator's settings come from the environment it is given, and only from it."""

from __future__ import annotations

from pathlib import Path

import pytest
from voxfleet_operator.config import ConfigError, load_config


def test_an_environment_given_is_the_whole_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pools = tmp_path / "pools.yaml"
    pools.write_text("defaultPool: a\npools: [{name: a, maxPods: 9}]\n")
    monkeypatch.setenv("VOXFLEET_POOLS_FILE", str(pools))
    monkeypatch.setenv("VOXFLEET_RESYNC_SECONDS", "5")
    monkeypatch.setenv("VOXFLEET_WATCH_NAMESPACES", "tts")

    # What the shell holds is not read when an environment is given: defaults throughout.
    defaults = load_config({})
    assert defaults.pools.get(None).name == "t4"
    assert defaults.resync_seconds == 30.0
    assert defaults.watch_namespaces == ()

    given = load_config({"VOXFLEET_POOLS_FILE": str(pools), "VOXFLEET_RESYNC_SECONDS": "5"})
    assert given.pools.get(None).max_pods == 9
    assert given.resync_seconds == 5.0
    # Without one, the process's own environment.
    assert load_config().watch_namespaces == ("tts",)


@pytest.mark.parametrize("value", ["soon", "0", "-1"])
def test_a_wrong_resync_interval_names_the_variable(value: str) -> None:
    with pytest.raises(ConfigError, match="VOXFLEET_RESYNC_SECONDS must be"):
        load_config({"VOXFLEET_RESYNC_SECONDS": value})
