"""kiln's reference TensorFlow trainer: ``python -m trainer``.

Importing the package pins the Keras flavour before anything can import
TensorFlow: Keras 3 (TF's default since 2.16) silently breaks Horovod's
callbacks, ``MultiWorkerMirroredStrategy.fit`` and ``ParameterServerStrategy``,
so every process uses ``tf_keras`` (see DESIGN.md, "Versions").
"""

import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
