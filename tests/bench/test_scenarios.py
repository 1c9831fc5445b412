"""Scenario matrix, selection and profiles."""

import pytest

from benchmarks.runner import Config
from benchmarks.scenarios import PROFILES, full_matrix, select
from benchmarks.servers import ServerSpec


def test_full_matrix_covers_every_combination_once():
    names = [s.name for s in full_matrix()]
    assert len(names) == len(set(names)) == 4 * 2 * 5 * 3
    assert "forest/b256/grpc-typed/c64" in names


def test_select_by_glob():
    chosen = select(full_matrix(), ["iris/b1/*/c64", "xgboost/b256/rest-json/c1"])
    assert len(chosen) == 6
    assert select(full_matrix(), None) == full_matrix()
    with pytest.raises(ValueError, match="no scenario matches"):
        select(full_matrix(), ["nope/*"])


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_profiles_name_real_servers_and_their_baseline(profile):
    chosen = PROFILES[profile]
    assert chosen.baseline in chosen.servers
    kinds = ("inferpool", "mlserver", "kserve", "bentoml", "litserve", "rayserve")
    assert all(ServerSpec.parse(name).kind in kinds for name in chosen.servers)


def test_quick_profile_loads_for_well_under_two_minutes(tmp_path):
    quick = PROFILES["quick"]
    config = Config(
        quick.scenarios,
        quick.servers,
        quick.baseline,
        quick.duration,
        quick.warmup,
        quick.repetitions,
        tmp_path,
        tmp_path,
    )
    assert config.estimate_seconds() <= 75  # leaves time for start-up and checks
