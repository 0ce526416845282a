"""``--data s3://`` and ``--model-dir s3://`` against a moto server on loopback
(real HTTP through boto3's endpoint_url, fake credentials from the environment).
Real trainer processes, no mocks."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from trainer import splits

pytestmark = [pytest.mark.integration, pytest.mark.quick]
moto_server = pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "kiln-data"


@pytest.fixture
def s3_env() -> Iterator[dict[str, str]]:
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "AWS_PROFILE")}
        env.update(
            AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
            KILN_AWS_ENDPOINT_URL=f"http://{host}:{port}", CUDA_VISIBLE_DEVICES="",
            PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        )
        yield env
    finally:
        server.stop()


def client(env: dict[str, str]):
    return boto3.session.Session(
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=env["AWS_DEFAULT_REGION"],
    ).client("s3", endpoint_url=env["KILN_AWS_ENDPOINT_URL"])


def trainer(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)


def test_npz_in_a_bucket_trains_and_the_export_lands_in_the_bucket(s3_env, tmp_path):
    s3 = client(s3_env)
    s3.create_bucket(Bucket=BUCKET)
    x, y = splits.digits()
    buffer = io.BytesIO()
    np.savez(buffer, x=x, y=y)
    s3.put_object(Bucket=BUCKET, Key="sets/digits.npz", Body=buffer.getvalue())
    cache = tmp_path / "cache"

    done = trainer(s3_env, "--data", f"s3://{BUCKET}/sets/digits.npz", "--cache-dir", str(cache),
                   "--model-dir", f"s3://{BUCKET}/exports/run-1", "--run-dir", str(tmp_path / "run"),
                   "--epochs", "2", "--learning-rate", "0.05")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (cache / "s3" / BUCKET / "sets" / "digits.npz").is_file()

    keys = sorted(item["Key"] for item in s3.list_objects_v2(Bucket=BUCKET, Prefix="exports/run-1/")["Contents"])
    assert "exports/run-1/saved_model.pb" in keys
    assert any(key.startswith("exports/run-1/variables/") for key in keys)
    local = tmp_path / "downloaded"
    for key in keys:
        target = local / key.removeprefix("exports/run-1/")
        target.parent.mkdir(parents=True, exist_ok=True)
        s3.download_file(BUCKET, key, str(target))

    import tensorflow as tf

    serve = tf.saved_model.load(str(local)).signatures["serving_default"]
    predicted = np.argmax(serve(features=tf.constant(x[:50]))["logits"].numpy(), axis=1)
    assert np.mean(predicted == y[:50]) >= 0.8


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--data", "s3://no-such-bucket/d.npz"],
         "trainer: error: --data s3://no-such-bucket/d.npz: bucket 'no-such-bucket' does not exist"),
        (["--data", f"s3://{BUCKET}/missing.npz"],
         f"trainer: error: --data s3://{BUCKET}/missing.npz: the object does not exist"),
        (["--model-dir", "s3://no-such-bucket/exports"],
         "trainer: error: --model-dir s3://no-such-bucket/exports: bucket 'no-such-bucket' does not exist"),
    ],
)
def test_missing_bucket_or_key_is_one_line_and_exit_2(s3_env, tmp_path, flags, message):
    client(s3_env).create_bucket(Bucket=BUCKET)
    run_dir, cache = tmp_path / "run", tmp_path / "cache"
    local_model = [] if "--model-dir" in flags else ["--model-dir", str(tmp_path / "model")]
    done = trainer(s3_env, *flags, *local_model, "--cache-dir", str(cache), "--run-dir", str(run_dir), "--epochs", "1")
    assert (done.returncode, done.stderr.splitlines()) == (2, [message]), done.stdout + done.stderr
    assert not run_dir.exists() and not cache.exists() and not (tmp_path / "model").exists()


def test_no_credentials_is_one_line_and_exit_2(s3_env, tmp_path):
    env = {k: v for k, v in s3_env.items() if not k.startswith("AWS_")}
    env.update(AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_EC2_METADATA_DISABLED="true")
    done = trainer(env, "--data", f"s3://{BUCKET}/d.npz", "--cache-dir", str(tmp_path / "cache"),
                   "--run-dir", str(tmp_path / "run"), "--model-dir", str(tmp_path / "model"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        f"trainer: error: --data s3://{BUCKET}/d.npz: no AWS credentials (set AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or an instance role)"
    ]
    assert not (tmp_path / "cache").exists()
