"""The convergence scenario through the in-memory API (the contract test runs it for real)."""

from __future__ import annotations

from convergence_scenarios import CHANGES, FakeBackend, drift_scenario
from fake_kube import FakeKube, kwok_gpu_nodes


def test_out_of_band_changes_are_set_back_once_and_the_sizing_switch_leaves_no_stale_key() -> None:
    seen = drift_scenario(FakeBackend(FakeKube(kwok_gpu_nodes())))
    assert seen[0] == ("rolled", True, "True")
    assert seen[1] == ("replicas", 1, 0)
    by_change = {entry[0]: entry for entry in seen[2:-2] if entry[1] is True}
    quiet = {entry[0]: entry[2] for entry in seen[2:-2] if entry[1] == "then quiet"}
    assert set(by_change) == set(CHANGES)
    for what in CHANGES:
        _, _, writes, events, restored = by_change[what]
        assert len(writes) == 1, (what, writes)
        assert writes[0][0] == "apply"
        assert events == [("Warning", "DriftReverted")], what
        assert restored, what
        assert quiet[what] == [], what
    assert seen[-2] == ("whole GPU", "nvidia.com/gpu", False)
    assert seen[-1] == ("whole GPU", "then quiet", [])
