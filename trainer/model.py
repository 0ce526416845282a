"""The models: a small dense or convolutional classifier (tf_keras)."""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tensorflow as tf
import tf_keras as keras

from trainer.data import FEATURES
from trainer.errors import TrainerError
from trainer.splits import CLASSES

MOMENTUM = 0.9


def build_model(seed: int, features: int = FEATURES, classes: int = CLASSES, kind: str = "mlp") -> keras.Model:
    """``mlp``: Input(features) → Dense(64, relu) → Dense(classes) logits; ``cnn``: the
    features as a square one-channel image → Conv2D(16, 3×3, relu) → MaxPool(2) → Dense(classes).
    Initialised from ``seed``. Build it inside the strategy's scope so its variables are distributed.
    """
    init = keras.initializers.GlorotUniform
    if kind == "cnn":
        side = math.isqrt(features)
        if side * side != features:
            raise TrainerError(f"--model cnn needs square images: {features} features are not n x n pixels")
        return keras.Sequential(
            [
                keras.Input(shape=(features,), name="pixels"),
                keras.layers.Reshape((side, side, 1), name="image"),
                keras.layers.Conv2D(16, 3, padding="same", activation="relu", kernel_initializer=init(seed),
                                    name="conv"),
                keras.layers.MaxPooling2D(2, name="pool"),
                keras.layers.Flatten(name="flat"),
                keras.layers.Dense(classes, kernel_initializer=init(seed + 1), name="logits"),
            ],
            name="digits_cnn",
        )
    return keras.Sequential(
        [
            keras.Input(shape=(features,), name="pixels"),
            keras.layers.Dense(64, activation="relu", kernel_initializer=init(seed), name="hidden"),
            keras.layers.Dense(classes, kernel_initializer=init(seed + 1), name="logits"),
        ],
        name="digits_mlp",
    )


def compile_model(
    model: keras.Model,
    learning_rate: float,
    wrap_optimizer: Callable[[keras.optimizers.Optimizer], keras.optimizers.Optimizer] | None = None,
) -> None:
    """SGD with momentum and sparse cross-entropy on logits; ``wrap_optimizer``
    lets Horovod average the gradients."""
    optimizer = keras.optimizers.SGD(learning_rate=learning_rate, momentum=MOMENTUM)
    if wrap_optimizer is not None:
        optimizer = wrap_optimizer(optimizer)
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )


def evaluate_accuracy(weights: list[np.ndarray], x_test: np.ndarray, y_test: np.ndarray, seed: int,
                      kind: str = "mlp") -> float:
    """Accuracy of ``weights`` on the test split, computed in this process only
    (a fresh model outside any strategy, so no collective is involved)."""
    local = build_model(seed, features=x_test.shape[1], classes=weights[-1].shape[0], kind=kind)
    local.set_weights(weights)
    logits = local(x_test, training=False).numpy()
    return float(np.mean(np.argmax(logits, axis=1) == y_test))


SERVING_SIGNATURE = "serving_default"
SERVING_INPUT = "features"
SERVING_OUTPUTS = ("logits", "probabilities")
# What a tf_keras SavedModel directory holds; a --model-dir with nothing else in
# it is an earlier export that may be replaced whole.
SAVED_MODEL_ENTRIES = frozenset({"saved_model.pb", "keras_metadata.pb", "fingerprint.pb", "variables", "assets"})


def serving_function(model: keras.Model) -> tf.types.experimental.GenericFunction:
    """The export's ``serving_default``: ``features`` (float32, [None, features])
    → ``logits`` (float32, [None, classes], unnormalised) and ``probabilities``
    (their softmax); the predicted class is the argmax of either."""
    features = int(model.input_shape[-1])

    @tf.function(input_signature=[tf.TensorSpec([None, features], tf.float32, name=SERVING_INPUT)])
    def serve(batch: tf.Tensor) -> dict[str, tf.Tensor]:
        logits = model(batch, training=False)
        return {"logits": logits, "probabilities": tf.nn.softmax(logits)}

    return serve


def export_model(weights: list[np.ndarray], path: Path, seed: int, features: int, kind: str = "mlp") -> None:
    """Save ``weights`` as a SavedModel at ``path`` with the ``serving_default``
    signature of :func:`serving_function` (``tf.saved_model.load`` serves it;
    ``keras.models.load_model`` still loads it).

    The model is a fresh copy outside any strategy, so no collective is involved
    and only the chief needs to call this. It is written next to ``path`` first
    and moved into place, so a crash leaves no half-written export there.
    """
    local = build_model(seed, features=features, classes=weights[-1].shape[0], kind=kind)
    local.set_weights(weights)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    local.save(
        str(partial),
        save_format="tf",
        include_optimizer=False,
        signatures={SERVING_SIGNATURE: serving_function(local)},
    )
    if path.is_dir() and {entry.name for entry in path.iterdir()} <= SAVED_MODEL_ENTRIES:
        shutil.rmtree(path)
    if path.exists():
        # The user's directory holds other files too: copy the export in beside them.
        shutil.copytree(partial, path, dirs_exist_ok=True)
        shutil.rmtree(partial)
    else:
        partial.rename(path)
