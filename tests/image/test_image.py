"""The container image as operators run it: the project's Dockerfile built with buildah
(``deploy/image/build.sh``, what ``make image`` runs), inspected, and the worker started in
it (``buildah run``, the image's own entrypoint and user, the host's network) against the
session's test broker: ``/readyz`` turns ready, events get decisions, a label makes a new
model version, and the process is stopped by its PID.

Marked ``image`` (``make test-image``; ``.ci/run`` runs it as a step of its own): it needs
root, buildah and, where the Dockerfile's base cannot be pulled, mmdebstrap.
``ABSTAIN_TEST_DOCKERFILE`` builds another Dockerfile (a deliberately broken one, say).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.config import Settings, Topics, load_settings
from service.localkafka import find_free_ports
from service.stream.kafka.clients import Client, read_topic

pytestmark = pytest.mark.image

REPO = Path(__file__).resolve().parents[2]
IMAGE = f"localhost/abstain-test:{uuid.uuid4().hex[:8]}"
BUILDAH = ["buildah", "--storage-driver", os.environ.get("STORAGE_DRIVER", "vfs")]
BUILD_TIMEOUT = 900.0  # the Debian-made base (~1-2 min) and the build (~2-3 min, vfs)
#: what only the dev extras bring: none of it belongs in the image
DEV_ONLY = {
    "pytest",
    "mypy",
    "ruff",
    "hypothesis",
    "playwright",
    "river",
    "cryptography",
    "pytest_xdist",
    "pytest_asyncio",
    "pyyaml",
}
TOKEN = "image-test-token-" + uuid.uuid4().hex


def buildah(*args: str, timeout: float = 60.0) -> str:
    done = subprocess.run(
        [*BUILDAH, *args],
        capture_output=True,
        text=True,  # noqa: S603
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"buildah {' '.join(args)}: {done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def image() -> Iterator[dict[str, Any]]:
    """Build the image (timed); removed after the module."""
    if shutil.which("buildah") is None:
        pytest.fail("buildah is not installed (apt-get install buildah mmdebstrap; .ci/run does)")
    env = {**os.environ}
    if os.environ.get("ABSTAIN_TEST_DOCKERFILE"):
        env["DOCKERFILE"] = os.environ["ABSTAIN_TEST_DOCKERFILE"]
    began = time.monotonic()
    done = subprocess.run(  # noqa: S603
        ["bash", str(REPO / "deploy" / "image" / "build.sh"), IMAGE],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
        check=False,
    )
    took = time.monotonic() - began
    assert done.returncode == 0, f"make image failed:\n{done.stderr[-5000:]}"
    inspected = json.loads(buildah("inspect", "--type", "image", IMAGE))
    try:
        yield {"inspect": inspected, "build_seconds": took, "log": done.stderr}
    finally:
        subprocess.run([*BUILDAH, "rmi", IMAGE], capture_output=True, check=False)  # noqa: S603


@pytest.fixture(scope="module")
def rootfs(image: dict[str, Any]) -> Iterator[Path]:
    """The image's file system, mounted read-only from a working container."""
    container = buildah("from", "--pull-never", IMAGE).strip()
    try:
        yield Path(buildah("mount", container).strip())
    finally:
        subprocess.run([*BUILDAH, "rm", container], capture_output=True, check=False)  # noqa: S603


def test_the_image_runs_as_the_unprivileged_user_and_reports_its_size(
    image: dict[str, Any], rootfs: Path, record_property: Any
) -> None:
    config = image["inspect"]["OCIv1"]["config"]
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["abstain"]
    assert config["Cmd"] == ["worker"]
    container = buildah("from", "--pull-never", IMAGE).strip()
    try:
        ident = buildah("run", "--isolation", "chroot", container, "--", "id", "-u").strip()
    finally:
        buildah("rm", container)
    assert ident == "10001"
    size = int(
        subprocess.run(
            ["du", "-sb", str(rootfs)],
            capture_output=True,
            text=True,  # noqa: S607
            check=True,
        ).stdout.split()[0]
    )
    record_property("image_bytes", size)
    record_property("build_seconds", round(image["build_seconds"], 1))
    print(f"\nimage {IMAGE}: {size / 1e6:.0f} MB, built in {image['build_seconds']:.0f} s")
    assert 0 < size < 700e6


def test_no_secret_ca_bundle_of_the_build_machine_or_dev_dependency_is_in_the_image(
    image: dict[str, Any], rootfs: Path
) -> None:
    config = image["inspect"]["OCIv1"]["config"]
    env = dict(item.split("=", 1) for item in config["Env"])
    secretive = ("PASSWORD", "TOKEN", "SECRET", "_KEY", "CERT", "CA_BUNDLE", "PIP_")
    assert not [k for k in env if any(word in k for word in secretive)], env
    history = " ".join(h.get("created_by", "") for h in image["inspect"]["OCIv1"]["history"])
    for word in ("pip.conf", "ca-certificates.crt", "--volume", "password", "token"):
        assert word not in history.lower(), word
    # the build machine's pip configuration and trust store were mounted, never copied
    for path in ("etc/pip.conf", "root/.config/pip", "root/.pip", "opt/abstain/pip.conf"):
        assert not (rootfs / path).exists(), path
    bundle = _certificates((rootfs / "etc/ssl/certs/ca-certificates.crt").read_text())
    packaged: set[str] = set()
    for crt in (rootfs / "usr/share/ca-certificates").rglob("*.crt"):
        packaged |= _certificates(crt.read_text())
    assert bundle, "the image has no CA bundle of its own"
    assert bundle == packaged, "the CA bundle is not the one the image's package makes"
    host = Path("/etc/ssl/certs/ca-certificates.crt")
    if host.is_file():
        extra = _certificates(host.read_text()) - packaged  # the build machine's own CAs
        assert not extra & bundle
    # runtime dependencies only
    site = next((rootfs / "opt/abstain/lib").glob("python3*/site-packages"))
    installed = {p.name.split("-")[0].lower() for p in site.glob("*.dist-info")}
    assert {"abstain", "faust_streaming", "aiokafka", "numpy"} <= installed, installed
    assert not DEV_ONLY & installed, DEV_ONLY & installed
    assert not list((rootfs / "opt/abstain").rglob("*.env"))


def _certificates(pem: str) -> set[str]:
    marker = "-----BEGIN CERTIFICATE-----"
    return {marker + part.split("-----END CERTIFICATE-----")[0] for part in pem.split(marker)[1:]}


def _get(
    url: str, *, data: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=data, headers=headers or {})  # noqa: S310
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:  # noqa: S310
            return int(resp.status), bytes(resp.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), bytes(exc.read())
    except OSError:
        return 0, b""


def _wait(
    check: Any, what: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 90
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, (
            f"the worker exited {proc.returncode}:\n{log.read_text()[-4000:]}"
        )
        if check():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}\n{log.read_text()[-4000:]}")


#: in the image, as its user: the compiled pass reads a tokens field and gives the inputs
#: the encoder gives (numba and llvmlite load, and compile, where the worker runs)
_READS_TOKENS = """
from service.features import FieldsConfig, encoder_of
from service.features.raw import reader_of
enc = encoder_of(FieldsConfig.model_validate({"hash_bits": 9, "fields": {"t": "tokens"}}))
read = reader_of(enc).fields(b'{"t": ["refund", "urgent", "r\\u00e9"]}')
print(read is None)
print(reader_of(enc).fields('{"t": ["refund", "urgent", "ré"]}'.encode())["t"].inputs.tolist())
print(enc.sparse({"t": ["refund", "urgent", "ré"]})[0].tolist())
"""


def test_the_image_reads_a_tokens_field_with_its_compiled_pass(image: dict[str, Any]) -> None:
    container = buildah("from", "--pull-never", IMAGE).strip()
    try:
        out = buildah(
            "run",
            "--isolation",
            "chroot",
            container,
            "--",
            "/opt/abstain/bin/python",
            "-c",
            _READS_TOKENS,
            timeout=180,
        ).splitlines()
    finally:
        buildah("rm", container)
    escaped, read, encoded = out[-3:]
    assert escaped == "True"  # an escape: orjson's way
    assert read == encoded, out
    assert len(read.split(",")) == 3, out


def test_the_worker_in_the_image_scores_events_and_learns_from_a_label(
    image: dict[str, Any], kafka_bootstrap: str, tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:8]
    port = find_free_ports(1)[0]
    config = {
        "app_id": f"image-{run}",
        "topics": Topics.prefixed(f"img{run}"),
        "partitions": {"features": 1, "decisions": 1, "labels": 1, "models": 1},
        "models": {"m": {"algorithm": "dsal", "cost": 0.25, "n_features": 3, "audit_rate": 0.5}},
        "default_model": "m",
        "log_level": "info",
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    os.chmod(tmp_path, 0o755)  # noqa: S103 - the image's user (uid 10001) reads the config
    os.chmod(tmp_path / "config.json", 0o644)
    settings = load_settings(broker=kafka_bootstrap, **config)
    entry = image["inspect"]["OCIv1"]["config"]
    container = buildah("from", "--pull-never", IMAGE).strip()
    log = tmp_path / "worker.log"
    argv = [
        *BUILDAH,
        "run",
        "--isolation",
        "chroot",
        "--volume",
        f"{tmp_path / 'config.json'}:/etc/abstain/config.json:ro",
        "--env",
        "ABSTAIN_CONFIG=/etc/abstain/config.json",
        "--env",
        f"ABSTAIN_BROKER={kafka_bootstrap}",
        "--env",
        f"ABSTAIN_WEB__PORT={port}",
        "--env",
        f"ABSTAIN_LABEL_TOKEN={TOKEN}",
        container,
        "--",
        *entry["Entrypoint"],
        *entry["Cmd"],
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,  # noqa: S603
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(lambda: _get(url + "/readyz")[0] == 200, "/readyz", proc, log)
        asyncio.run(_send_events(settings))
        _wait(
            lambda: len(asyncio.run(read_topic(settings, settings.topics.decisions))) >= 10,
            "decisions",
            proc,
            log,
        )
        _wait(
            lambda: bool(asyncio.run(read_topic(settings, settings.topics.label_requests))),
            "a label request",
            proc,
            log,
        )
        request = json.loads(
            asyncio.run(read_topic(settings, settings.topics.label_requests))[0].value
        )
        body = json.dumps({"request_id": request["request_id"], "model": "m", "label": 1})
        status, answer = _get(
            url + "/labels",
            data=body.encode(),
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        )
        assert status == 202, answer
        _wait(
            lambda: (
                json.loads(_get(url + "/readyz")[1] or b"{}").get("models", {}).get("m", 0) >= 1
            ),
            "model version 1",
            proc,
            log,
        )
    finally:
        _stop(proc)
        subprocess.run([*BUILDAH, "rm", container], capture_output=True, check=False)  # noqa: S603
    assert TOKEN not in log.read_text(errors="replace")


async def _send_events(settings: Settings) -> None:
    async with Client(settings) as client:
        for i in range(10):
            event = {"id": f"e{i}", "model": "m", "features": [1.0, -0.5, 0.3 * i]}
            await client.send(settings.topics.features, f"e{i}", event)
        await client.flush()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group this test started (buildah run and the worker under it,
    by the PID it was given), SIGKILL after 20 s."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
