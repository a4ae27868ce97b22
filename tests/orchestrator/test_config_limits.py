"""Config limits (orchestrator/config.py): a free-form `options` mapping holds at most 100,000 values (a
plain list or a YAML alias bomb beyond that is a one-line `ConfigError`), and `tau` lies in the open
interval (0, 1), both ends excluded."""

from __future__ import annotations

import pytest

from orchestrator.config import load_config, load_config_text
from orchestrator.errors import ConfigError

OBJECTIVE = {"name": "forrester"}


def test_options_of_exactly_100000_values_are_accepted():
    # the options mapping (1) + the list (1) + 99,998 items = 100,000 values
    cfg = load_config({"objective": OBJECTIVE, "model": {"type": "quantile", "options": {"xs": [0] * 99_998}}})
    assert len(cfg.model.options["xs"]) == 99_998


def test_options_beyond_100000_values_are_refused():
    with pytest.raises(ConfigError, match="holds more than 100000 values"):
        load_config({"objective": OBJECTIVE, "model": {"type": "quantile", "options": {"xs": [0] * 100_001}}})


def test_options_one_value_too_many_are_refused():
    # 1 + 1 + 99,999 = 100,001 values
    with pytest.raises(ConfigError, match="`model.options.xs.*` holds more than 100000 values"):
        load_config({"objective": OBJECTIVE, "model": {"type": "quantile", "options": {"xs": [0] * 99_999}}})


def test_yaml_alias_bomb_in_options_is_refused():
    # 10 ** 6 leaf values through aliases: cheap to parse, far above the limit once expanded
    text = (
        "objective: {name: forrester}\n"
        "model:\n"
        "  type: quantile\n"
        "  options:\n"
        "    a: &a [0, 0, 0, 0, 0, 0, 0, 0, 0, 0]\n"
        "    b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
        "    c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
        "    d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
        "    e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\n"
        "    f: [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\n"
    )
    with pytest.raises(ConfigError, match="holds more than 100000 values") as info:
        load_config_text(text, source="bomb.yaml")
    assert str(info.value).startswith("bomb.yaml: ")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("tau", [1.0, 1, 0.0, 0, 1.5, -0.1])
def test_tau_outside_the_open_interval_is_refused(tau):
    with pytest.raises(ConfigError) as info:
        load_config({"objective": OBJECTIVE, "tau": tau})
    assert str(info.value) == f"`tau` must be a number in (0, 1); got {tau!r}"


def test_tau_one_in_yaml_is_refused():
    with pytest.raises(ConfigError, match=r"`tau` must be a number in \(0, 1\); got 1\.0"):
        load_config_text("objective: {name: forrester}\ntau: 1.0\n")


@pytest.mark.parametrize("tau", [0.999, 0.001, 0.5])
def test_tau_inside_the_open_interval_is_accepted(tau):
    assert load_config({"objective": OBJECTIVE, "tau": tau}).tau == tau
