"""Routing of --data / --model-dir locations (pure: no network, no TensorFlow)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.cli import parse_args
from trainer.config import TrainConfig
from trainer.errors import TrainerError
from trainer.storage import Location, cache_path, default_cache_dir, is_remote, parse_location, upload_keys

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("text", "location"),
    [
        ("s3://bucket/sets/digits.npz", Location("s3", "bucket", "sets/digits.npz")),
        ("gs://bucket/sets/digits.npz", Location("gs", "bucket", "sets/digits.npz")),
        ("s3://bucket/exports/run-1/", Location("s3", "bucket", "exports/run-1")),
        ("s3://bucket", Location("s3", "bucket", "")),
        ("/data/digits.npz", Location("", "", "/data/digits.npz")),
        ("s3:/bucket/x.npz", Location("", "", "s3:/bucket/x.npz")),
    ],
)
def test_locations_route_by_scheme(text, location):
    assert parse_location(text) == location
    assert is_remote(text) == location.remote


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("s3:///x.npz", "s3:///x.npz: no bucket name"),
        ("gs://b/../etc/x.npz", "gs://b/../etc/x.npz: '.' and '..' are not allowed in the object key"),
    ],
)
def test_bad_remote_names_are_refused(text, message):
    with pytest.raises(TrainerError) as error:
        parse_location(text)
    assert str(error.value) == message


def test_remote_objects_are_cached_by_scheme_bucket_and_key():
    location = parse_location("gs://b/sets/d.npz")
    assert cache_path(Path("/c"), location) == Path("/c/gs/b/sets/d.npz")
    assert default_cache_dir({"XDG_CACHE_HOME": "/x"}) == Path("/x/kiln/data")
    assert default_cache_dir({}) == Path.home() / ".cache" / "kiln" / "data"


def test_saved_model_pb_is_uploaded_last():
    files = ["saved_model.pb", "variables/variables.index", "fingerprint.pb", "variables/variables.data-00000-of-00001"]
    assert upload_keys(files, "exports/run-1") == [
        ("fingerprint.pb", "exports/run-1/fingerprint.pb"),
        ("variables/variables.data-00000-of-00001", "exports/run-1/variables/variables.data-00000-of-00001"),
        ("variables/variables.index", "exports/run-1/variables/variables.index"),
        ("saved_model.pb", "exports/run-1/saved_model.pb"),
    ]
    assert upload_keys(["saved_model.pb"], "") == [("saved_model.pb", "saved_model.pb")]


def test_remote_model_dir_and_data_land_in_train_config():
    config = parse_args(["--data", "gs://b/d.npz", "--model-dir", "s3://b/exports", "--cache-dir", "/c"])
    assert (config.data, config.model_uri, config.model_dir, config.cache_dir) == (
        "gs://b/d.npz", "s3://b/exports", TrainConfig().model_dir, Path("/c"),
    )
    assert parse_args(["--model-dir", "/m"]).model_uri is None


@pytest.mark.parametrize("flag", ["--checkpoint-dir", "--run-dir", "--cache-dir"])
def test_remote_checkpoint_run_and_cache_dirs_are_refused(flag):
    with pytest.raises(TrainerError) as error:
        parse_args([flag, "s3://b/ckpt"])
    assert str(error.value) == (
        f"argument {flag}: s3://b/ckpt: must be a local (or shared) folder; "
        "only --data and --model-dir take s3:// or gs://"
    )
