"""Settings: defaults, sources and their precedence, validation messages, secrets."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import pytest

from service.config import ConfigError, KafkaSecurity, ModelConfig, Settings, load_settings

WILDCARD = "0.0.0.0"  # noqa: S104 - the bind address under test


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("ABSTAIN_"):
            monkeypatch.delenv(key)


def test_defaults_serve_one_model_shaped_for_the_demo_data() -> None:
    s = load_settings()
    assert list(s.models) == ["default"]
    assert s.models["default"].n_inputs == 68  # phishing has 68 one-hot features
    assert s.models["default"].n_learner_features == 69  # plus the intercept
    assert s.topics.models == "abstain.models"
    assert s.topics.dead_letters == "abstain.dead-letters"
    assert s.default_model == "default"


def test_settings_are_frozen() -> None:
    s = load_settings()
    with pytest.raises(ValueError, match="frozen"):
        s.app_id = "other"  # type: ignore[misc]


def test_environment_overrides_with_nested_delimiter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ABSTAIN_WEB__PORT", "7123")
    monkeypatch.setenv("ABSTAIN_BROKER", "h1:9092, h2:9093")
    monkeypatch.setenv("ABSTAIN_TOPICS__LABELS", "x.labels")
    s = load_settings()
    assert s.web.port == 7123
    assert s.broker == ("kafka://h1:9092", "kafka://h2:9093")
    assert s.bootstrap_servers == ["h1:9092", "h2:9093"]
    assert s.topics.labels == "x.labels"
    assert s.topics.features == "abstain.features"


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_config_file_is_read_and_env_wins_over_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str
) -> None:
    path = tmp_path / f"abstain{suffix}"
    if suffix == ".json":
        path.write_text(
            json.dumps(
                {
                    "app_id": "from-file",
                    "web": {"port": 7001},
                    "models": {
                        "spam": {"algorithm": "dral", "cost": 0.1, "feature_names": ["a", "b"]}
                    },
                    "default_model": "spam",
                }
            )
        )
    else:
        path.write_text(
            'app_id = "from-file"\ndefault_model = "spam"\n[web]\nport = 7001\n'
            '[models.spam]\nalgorithm = "dral"\ncost = 0.1\nfeature_names = ["a", "b"]\n'
        )
    monkeypatch.setenv("ABSTAIN_CONFIG", str(path))
    monkeypatch.setenv("ABSTAIN_APP_ID", "from-env")
    s = load_settings()
    assert s.app_id == "from-env"
    assert s.web.port == 7001
    assert s.models["spam"].algorithm == "dral"
    assert s.models["spam"].feature_names == ("a", "b")
    assert load_settings(path, app_id="from-arg").app_id == "from-arg"


def test_unknown_file_type_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "abstain.yaml"
    path.write_text("app_id: x\n")
    with pytest.raises(ConfigError, match=r"\.json or \.toml"):
        load_settings(path)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"models": {"m": {"cost": 0.5, "n_features": 2}}, "default_model": "m"}, "models.m.cost"),
        (
            {"models": {"m": {"algorithm": "svm", "n_features": 2}}, "default_model": "m"},
            "models.m.algorithm",
        ),
        ({"models": {"m": {"cost": 0.2}}, "default_model": "m"}, "models.m"),
        ({"default_model": "nope"}, "default_model"),
        ({"web": {"port": 70000}}, "web.port"),
        ({"request_ttl_seconds": 0}, "request_ttl_seconds"),
        ({"topics": {"labels": "abstain.features"}}, "topics"),
        (
            {"models": {"m": {"n_features": 2, "audit_rate": 1.0}}, "default_model": "m"},
            "models.m.audit_rate",
        ),
        ({"unknown_field": 1}, "unknown_field"),
    ],
)
def test_validation_errors_name_the_field(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(**overrides)
    assert f"  {field}" in str(info.value)


def test_secrets_never_show_in_repr_or_dump() -> None:
    s = load_settings(
        label_token="tok-123-long-enough",  # noqa: S106 - test secret
        security={
            "protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "PLAIN",
            "username": "svc",
            "password": "pw-456",
        },
    )
    text = repr(s) + str(s) + str(s.model_dump())
    assert "tok-123-long-enough" not in text
    assert "pw-456" not in text
    assert s.label_token is not None
    assert s.label_token.get_secret_value() == "tok-123-long-enough"


def test_sasl_settings_become_aiokafka_arguments() -> None:
    sec = KafkaSecurity(
        protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-256",
        username="u",
        password="p",  # noqa: S106
    )
    kw = sec.aiokafka_kwargs()
    assert kw == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_plain_username": "u",
        "sasl_plain_password": "p",
    }
    assert sec.ssl_context() is None


def test_ssl_builds_a_context_and_checks_files(tmp_path: Path) -> None:
    ctx = KafkaSecurity(protocol="SSL").ssl_context()
    assert ctx is not None
    assert ctx.check_hostname
    with pytest.raises(ValueError, match="ca_file"):
        KafkaSecurity(protocol="SSL", ca_file=tmp_path / "missing.pem")
    with pytest.raises(ValueError, match="needs sasl_mechanism"):
        KafkaSecurity(protocol="SASL_SSL", username="u", password="p")  # noqa: S106
    with pytest.raises(ValueError, match="protocol is PLAINTEXT"):
        KafkaSecurity(sasl_mechanism="PLAIN")


def test_feature_names_and_count_must_agree() -> None:
    with pytest.raises(ConfigError, match="n_features=3 but 2 feature_names"):
        load_settings(
            models={"m": {"n_features": 3, "feature_names": ["a", "b"]}}, default_model="m"
        )
    s = Settings(models={"m": {"feature_names": ["a", "b"]}}, default_model="m")
    assert s.models["m"].n_inputs == 2


def test_wildcard_bind_advertises_the_host_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ABSTAIN_WEB__HOST", WILDCARD)  # what the Helm chart sets
    web = load_settings().web
    assert web.host == WILDCARD
    assert web.advertised == socket.gethostname() != WILDCARD


def test_advertised_host_can_be_set_and_a_concrete_bind_is_advertised_as_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ABSTAIN_WEB__HOST", WILDCARD)
    monkeypatch.setenv("ABSTAIN_WEB__ADVERTISED_HOST", "abstain-0.abstain.svc")
    assert load_settings().web.advertised == "abstain-0.abstain.svc"
    monkeypatch.delenv("ABSTAIN_WEB__ADVERTISED_HOST")
    monkeypatch.setenv("ABSTAIN_WEB__HOST", "10.1.2.3")
    assert load_settings().web.advertised == "10.1.2.3"


def test_desk_defaults_to_its_own_port_and_built_in_accounts() -> None:
    desk = load_settings().desk
    assert (desk.port, desk.auth, desk.lease_seconds) == (6070, "users", 120.0)
    assert desk.leases_topic == "abstain.desk-leases"
    assert desk.session_key is None


def test_desk_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ABSTAIN_DESK__PORT", "7070")
    monkeypatch.setenv("ABSTAIN_DESK__AUTH", "proxy")
    monkeypatch.setenv("ABSTAIN_DESK__TRUSTED_PROXIES", "10.0.0.0/24, 2001:db8::7")
    desk = load_settings().desk
    assert (desk.port, desk.auth, desk.proxy_header) == (7070, "proxy", "X-Forwarded-User")
    assert desk.trusted_proxies == ("10.0.0.0/24", "2001:db8::7/128")
    monkeypatch.setenv("ABSTAIN_DESK__TRUSTED_PROXIES", '["192.0.2.1"]')
    assert load_settings().desk.trusted_proxies == ("192.0.2.1/32",)


def test_desk_refuses_a_short_session_key_and_a_proxy_without_header() -> None:
    with pytest.raises(ConfigError, match="session_key is 5 characters"):
        load_settings(desk={"session_key": "short"})
    with pytest.raises(ConfigError, match="proxy_header"):
        load_settings(desk={"auth": "proxy", "proxy_header": " "})
    with pytest.raises(ConfigError, match="desk.lease_seconds"):
        load_settings(desk={"lease_seconds": 1})


@pytest.mark.parametrize(
    ("proxies", "message"),
    [
        (["10.0.0.1", " "], "is not an address"),
        (["10.0.0.1/8"], "host bits set"),
        (["0.0.0.0/0"], "trusts every address"),
        (["::/0"], "trusts every address"),
        (["proxy.example"], "does not appear to be"),
        (["10.0.0.1"] * 65, "at most 64"),
        ("[not json", "not a JSON list"),
    ],
)
def test_desk_trusted_proxies_are_checked(proxies: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(desk={"trusted_proxies": proxies})


def test_a_proxy_desk_needs_the_proxies_it_trusts_and_two_distinct_topics() -> None:
    for empty in ([], "", " "):
        with pytest.raises(ConfigError, match="auth = proxy needs trusted_proxies"):
            load_settings(desk={"auth": "proxy", "trusted_proxies": empty})
    assert load_settings(desk={"auth": "proxy", "trusted_proxies": ["::1"]}).desk.auth == "proxy"
    with pytest.raises(ConfigError, match="must differ"):
        load_settings(desk={"revocations_topic": "abstain.desk-leases"})
    with pytest.raises(ConfigError, match="revocations_topic"):
        load_settings(desk={"revocations_topic": "a topic with spaces"})


def test_desk_session_key_is_never_printed() -> None:
    s = load_settings(desk={"session_key": "k" * 40})
    assert "kkkk" not in repr(s)
    assert s.desk.session_key is not None


def test_a_model_is_adaptive_by_default_and_each_part_turns_off() -> None:
    s = load_settings(models={"m": {"n_features": 2}}, default_model="m")
    parts = s.models["m"].adaptive.parts()
    assert parts is not None
    assert (parts.detector, parts.challengers, parts.explore, parts.steps) == (True,) * 4
    off = load_settings(
        models={
            "m": {
                "n_features": 2,
                "adaptive": {"challengers": False, "explore": False, "steps": False},
            }
        },
        default_model="m",
    ).models["m"]
    assert off.adaptive.parts() == type(parts)(
        detector=True, challengers=False, explore=False, steps=False
    )
    bare = load_settings(
        models={"m": {"n_features": 2, "adaptive": {"enabled": False}}}, default_model="m"
    )
    assert bare.models["m"].adaptive.parts() is None


@pytest.mark.parametrize(
    ("adaptive", "field"),
    [
        ({"detectr": False}, "models.m.adaptive.detectr"),
        ({"detector": "sometimes"}, "models.m.adaptive.detector"),
        ({"explore": ""}, "models.m.adaptive.explore"),
        ({"challengers": 2}, "models.m.adaptive.challengers"),
        ({"steps": "often"}, "models.m.adaptive.steps"),
        ("on", "models.m.adaptive"),
    ],
)
def test_a_bad_adaptive_section_is_refused_with_its_field(adaptive: object, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(models={"m": {"n_features": 2, "adaptive": adaptive}}, default_model="m")
    assert field in str(err.value)


def test_desk_review_settings_default_and_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    desk = load_settings().desk
    assert (desk.undo_seconds, desk.reviewers) == (600.0, ())
    rule = desk.second_opinions
    assert (rule.enabled, rule.share, rule.min_weight, rule.within_seconds) == (
        True,
        0.05,
        20.0,
        86400.0,
    )
    monkeypatch.setenv("ABSTAIN_DESK__REVIEWERS", "rita, sam@example.org")
    monkeypatch.setenv("ABSTAIN_DESK__SECOND_OPINIONS__SHARE", "0.2")
    monkeypatch.setenv("ABSTAIN_DESK__UNDO_SECONDS", "60")
    desk = load_settings().desk
    assert desk.reviewers == ("rita", "sam@example.org")
    assert (desk.second_opinions.share, desk.undo_seconds) == (0.2, 60.0)
    monkeypatch.setenv("ABSTAIN_DESK__REVIEWERS", "")
    assert load_settings().desk.reviewers == ()


@pytest.mark.parametrize(
    ("desk", "message"),
    [
        ({"reviewers": ["rita", "rita"]}, "desk.reviewers: reviewers: 'rita' is named twice"),
        ({"reviewers": ["rita", " "]}, "desk.reviewers: reviewers: ' ' is not a user name"),
        ({"reviewers": ["<b>"]}, "is not a user name"),
        ({"reviewers": [f"r{i}" for i in range(1001)]}, "at most 1000 user names"),
        ({"undo_seconds": -1}, "desk.undo_seconds"),
        ({"undo_seconds": 1e12}, "desk.undo_seconds"),
        ({"second_opinions": {"share": 1.5}}, "desk.second_opinions.share"),
        ({"second_opinions": {"share": ""}}, "desk.second_opinions.share"),
        ({"second_opinions": {"share": " "}}, "desk.second_opinions.share"),
        ({"second_opinions": {"min_weight": 0.5}}, "desk.second_opinions.min_weight"),
        ({"second_opinions": {"min_weight": float("nan")}}, "min_weight: Input should be a fin"),
        ({"second_opinions": {"confident_margin": 1e300}}, "desk.second_opinions.confident_"),
        ({"second_opinions": {"within_seconds": 0}}, "desk.second_opinions.within_seconds"),
        ({"second_opinions": {"within_seconds": 1e9}}, "desk.second_opinions.within_seconds"),
        ({"second_opinions": {"shar": 0.1}}, "desk.second_opinions.shar"),
    ],
)
def test_desk_review_settings_are_checked_and_the_message_names_the_field(
    desk: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_settings(desk=desk)


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"hyperparameters": {"tail": -1}}, "models.default: hyperparameters: tail must be"),
        ({"hyperparameters": {"bogus": 1}}, "unexpected keyword argument 'bogus'"),
        ({"hyperparameters": {"eta": "fast"}}, "eta must be a number or a schedule"),
        ({"algorithm": "dral", "hyperparameters": {"tail": 1}}, "'dral'.*'tail'"),
        ({"algorithm": "kernel-dsal", "hyperparameters": {"gamma": 0}}, "gamma must be in"),
    ],
)
def test_a_hyperparameter_the_learner_refuses_is_refused_with_the_settings(
    model: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(models={"default": {"n_features": 2, **model}})


def test_the_double_sigmoid_learners_take_a_tail() -> None:
    for algorithm in ("dsal", "dsol", "kernel-dsal", "kernel-dsol"):
        settings = load_settings(
            models={
                "default": {"n_features": 2, "algorithm": algorithm, "hyperparameters": {"tail": 2}}
            }
        )
        assert settings.models["default"].learner_hyperparameters["tail"] == 2


def test_a_model_turns_take_back_off_in_its_adaptive_settings() -> None:
    from service.stream.models.served import ServedModel, initial_envelope  # noqa: PLC0415

    off = ModelConfig(n_features=2, adaptive={"take_back": False})
    assert off.adaptive.parts().take_back is False  # type: ignore[union-attr]
    assert initial_envelope("m", off).learner["params"]["take_back"] is False
    assert ServedModel.initial("m", off).learner.take_back is False
    assert ServedModel.initial("m", ModelConfig(n_features=2)).learner.take_back is True
