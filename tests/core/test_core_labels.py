"""Kubernetes label syntax, sanitising, merging and ownership."""

from labeller.model.config import Config
from labeller.model.inventory import Inventory
from labeller.model.offer import Offer
from labeller.model.labels import LabelSet, is_valid_value, key_problem, merge, owns, sanitise_value, validated


def test_value_syntax_matches_kubernetes_rules() -> None:
    assert is_valid_value("")
    assert is_valid_value("NVIDIA-A100-SXM4-40GB")
    assert is_valid_value("a" * 63)
    assert not is_valid_value("a" * 64)
    assert not is_valid_value("-leading")
    assert not is_valid_value("trailing.")
    assert not is_valid_value("has space")
    assert not is_valid_value("AMD Instinct MI250X / MI250")


def test_key_syntax() -> None:
    assert key_problem("nvidia.com/gpu.product") is None
    assert key_problem("beta.amd.com/gpu.product-name.AMD_Instinct_MI300X_OAM") is None
    assert key_problem("nvidia.com/" + "x" * 64) is not None
    assert key_problem("Bad_Prefix.com/x") is not None
    assert key_problem("nvidia.com/-x") is not None


def test_sanitise_makes_free_text_valid_and_keeps_it_recognisable() -> None:
    assert sanitise_value("AMD Instinct MI250X / MI250") == "AMD-Instinct-MI250X-MI250"
    assert sanitise_value("(weird)") == "weird"
    long = sanitise_value("NVIDIA " + "X" * 80 + " end")
    assert len(long) <= 63 and is_valid_value(long) and long.startswith("NVIDIA-X")


def test_one_invalid_value_is_dropped_alone() -> None:
    result = validated(LabelSet(labels={"nvidia.com/gpu.product": "bad value!", "nvidia.com/gpu.count": "8"}))
    assert result.labels == {"nvidia.com/gpu.count": "8"}
    assert "nvidia.com/gpu.product" in result.dropped


def test_merge_reports_conflicting_values_instead_of_silently_overwriting() -> None:
    def first(inv: Inventory, cfg: Config, offer: Offer) -> dict[str, str]:
        return {"nvidia.com/gpu.product": "A", "nvidia.com/gpu.count": "1"}

    def second(inv: Inventory, cfg: Config, offer: Offer) -> dict[str, str]:
        return {"nvidia.com/gpu.product": "B", "nvidia.com/gpu.count": "1"}

    result = merge([first, second], Inventory(), Config(), Offer())
    assert len(result.conflicts) == 1 and "nvidia.com/gpu.product" in result.conflicts[0]


def test_ownership_excludes_other_controllers_keys() -> None:
    assert owns("nvidia.com/gpu.product")
    assert owns("nvidia.com/mig-1g.10gb.count")
    assert owns("beta.amd.com/gpu.cu-count.104")
    assert owns("amd.com/gpu.present")
    assert not owns("nvidia.com/gpu.deploy.device-plugin")  # GPU Operator's
    assert not owns("nvidia.com/device-plugin.config")  # users'
    assert not owns("nvidia.com/mig.config")  # MIG manager's
    assert not owns("amd.com/gpu")  # a user label AMD's own tests keep
    assert not owns("team")
