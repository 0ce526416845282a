"""The model: a small dense classifier for 64 features and 10 classes (tf_keras)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import tf_keras as keras

from trainer.data import CLASSES, FEATURES

MOMENTUM = 0.9


def build_model(seed: int, features: int = FEATURES, classes: int = CLASSES) -> keras.Model:
    """Input(features) → Dense(64, relu) → Dense(classes) logits, initialised from ``seed``.

    Build it inside the strategy's scope so its variables are distributed.
    """
    init = keras.initializers.GlorotUniform
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


def evaluate_accuracy(weights: list[np.ndarray], x_test: np.ndarray, y_test: np.ndarray, seed: int) -> float:
    """Accuracy of ``weights`` on the test split, computed in this process only
    (a fresh model outside any strategy, so no collective is involved)."""
    local = build_model(seed, features=weights[0].shape[0], classes=weights[-1].shape[0])
    local.set_weights(weights)
    logits = local(x_test, training=False).numpy()
    return float(np.mean(np.argmax(logits, axis=1) == y_test))


def save_model(model: keras.Model, path: Path) -> None:
    """Save a TensorFlow SavedModel (servable by tensorflow_model_server)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    model.save(str(path), save_format="tf", include_optimizer=False)
