"""A subscription's input model named in a config file (``input_model = "module:Class"``),
imported from beside the file: the input is checked by it and the job gets its dump."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobledger.cli.config_file import load_settings
from jobledger.domain.errors import ConfigError
from jobledger.domain.subscription import Message, SubscriptionMessageError

MODELS = """
from pydantic import BaseModel


class Order(BaseModel):
    order: str
    amount: float = 0
"""

CONFIG = """
[[subscriptions]]
name = "orders"
topic = "shop.orders"
tenant = "acme"
workflow = "fulfil"
input_model = "{model}"
"""


def message(value: object) -> Message:
    return Message("shop.orders", 0, 7, b"k", (), value)


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Path]:
    # A module name of this test's own: an earlier import of another one is not reused.
    (tmp_path / "shop_models_x1.py").write_text(MODELS)
    yield tmp_path
    sys.modules.pop("shop_models_x1", None)


def test_a_model_named_in_the_config_file_checks_the_input_and_fills_defaults(
    deployment: Path,
) -> None:
    config = deployment / "jobledger.toml"
    config.write_text(CONFIG.format(model="shop_models_x1:Order"))
    (subscription,) = load_settings(config, None).engine.subscribing.subscriptions
    assert subscription.input_of(message({"order": "o-1"})) == {"order": "o-1", "amount": 0.0}
    with pytest.raises(SubscriptionMessageError) as refused:
        subscription.input_of(message({"order": "o-1", "amount": "lots"}))
    assert refused.value.reason == "schema"
    assert refused.value.detail.startswith("amount:")


@pytest.mark.parametrize(
    ("model", "says"),
    [
        ("shop_models_x1:Nope", "has no attribute 'Nope'"),
        ("no_such_module_q:Order", "No module named 'no_such_module_q'"),
        ("shop_models_x1", "expected module:Class"),
        ("shop_models_x1:BaseModel.__name__", "does not import"),
    ],
)
def test_a_model_that_does_not_import_is_a_config_error_naming_it(
    deployment: Path, model: str, says: str
) -> None:
    config = deployment / "jobledger.toml"
    config.write_text(CONFIG.format(model=model))
    with pytest.raises(ConfigError, match="input_model") as refused:
        load_settings(config, None)
    assert says in str(refused.value)


def test_a_name_that_is_not_a_pydantic_model_is_refused(deployment: Path) -> None:
    (deployment / "shop_models_x1.py").write_text(MODELS + "\nNOT_A_MODEL = 3\n")
    config = deployment / "jobledger.toml"
    config.write_text(CONFIG.format(model="shop_models_x1:NOT_A_MODEL"))
    with pytest.raises(ConfigError, match="is not a pydantic model class"):
        load_settings(config, None)
