"""Run by the alibi-deep environment's python (tests/alibi_deep/test_alibi_deep.py), not
by pytest: saves the detectors and explainers of PyTorch and TensorFlow models the test
serves into the repository folder given as its first argument, and prints, as one JSON
line, what they answer in that environment to the requests given (JSON) as its second.

- MMDDrift on its PyTorch and its TensorFlow backend, saved with ``save_detector``
  (config.toml) and loaded back with ``load_detector``; its permutation test draws with
  the backend's generator, seeded here (``SEEDS``: the spread of what is random, for the
  test's tolerances);
- OutlierAE, the outlier detector of a Keras autoencoder (no randomness at predict);
- ModelDistillation and AdversarialAE, adversarial detectors of a Keras classifier,
  saved with ``save_detector`` (alibi-detect's legacy format: meta.dill and the Keras
  models);
- IntegratedGradients of that classifier, saved with ``explainer.save``; the classifier
  itself saved as an HDF5 file, the white-box explainer's ``infer_uri``.
"""

import json
import sys

import numpy as np
import tensorflow as tf
import torch
from alibi.explainers import IntegratedGradients
from alibi.saving import load_explainer
from alibi_detect.ad import AdversarialAE, ModelDistillation
from alibi_detect.cd import MMDDrift
from alibi_detect.od import OutlierAE
from alibi_detect.saving import load_detector, save_detector
from sklearn.datasets import load_iris

SEEDS = range(10)  # the permutation test's answers under these seeds
N_PERMUTATIONS = 1000


def plain(data: dict) -> dict:
    return {k: None if v is None else np.asarray(v).tolist() for k, v in data.items()}


def mmd(root: str, requests: dict, backend: str, folder: str) -> dict:
    x_ref = np.random.default_rng(0).normal(size=(100, 4)).astype(np.float32)
    detector = MMDDrift(x_ref, backend=backend, p_val=0.05, n_permutations=N_PERMUTATIONS)
    save_detector(detector, f"{root}/{folder}/detector")
    loaded = load_detector(f"{root}/{folder}/detector")
    answers = {}
    for name, rows in requests.items():
        x = np.asarray(rows, dtype=np.float32)
        seeded = []
        for seed in SEEDS:
            torch.manual_seed(seed)
            tf.random.set_seed(seed)
            np.random.seed(seed)
            seeded.append(plain(loaded.predict(x)["data"]))
        answers[name] = seeded
    return {"answers": answers, "meta": loaded.meta}


def classifier() -> tuple:
    x, y = load_iris(return_X_y=True)
    x = x.astype(np.float32)
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(4,)),
        tf.keras.layers.Dense(16, activation="relu"),
        tf.keras.layers.Dense(3, activation="softmax"),
    ])  # fmt: skip
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model.fit(x, y, epochs=30, batch_size=32, verbose=0)
    return model, x


def distillation(root: str, model, x: np.ndarray, rows: np.ndarray) -> dict:
    distilled = tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(4,)),
        tf.keras.layers.Dense(8, activation="relu"),
        tf.keras.layers.Dense(3, activation="softmax"),
    ])  # fmt: skip
    detector = ModelDistillation(distilled_model=distilled, model=model, loss_type="kld")
    detector.fit(x, epochs=5, batch_size=32, verbose=False)
    detector.infer_threshold(x, threshold_perc=95)
    save_detector(detector, root + "/distillation/detector")
    loaded = load_detector(root + "/distillation/detector")
    return {"data": plain(loaded.predict(rows)["data"]), "meta": loaded.meta}


def dense(inputs: int, units: int, **options) -> tf.keras.Model:
    layer = tf.keras.layers.Dense(units, **options)
    return tf.keras.Sequential([tf.keras.layers.InputLayer(input_shape=(inputs,)), layer])


def autoencoder(root: str, model, x: np.ndarray, rows: np.ndarray) -> dict:
    detector = AdversarialAE(
        encoder_net=dense(4, 2, activation="relu"), decoder_net=dense(2, 4), model=model
    )
    detector.fit(x, epochs=5, batch_size=32, verbose=False)
    detector.infer_threshold(x, threshold_perc=95)
    save_detector(detector, root + "/autoencoder/detector")
    loaded = load_detector(root + "/autoencoder/detector")
    return {"data": plain(loaded.predict(rows)["data"]), "meta": loaded.meta}


def outlier_ae(root: str, x: np.ndarray, rows: np.ndarray) -> dict:
    detector = OutlierAE(encoder_net=dense(4, 2, activation="relu"), decoder_net=dense(2, 4))
    detector.fit(x, epochs=5, batch_size=32, verbose=False)
    detector.infer_threshold(x, threshold_perc=95)
    save_detector(detector, root + "/outlier-ae/detector")
    loaded = load_detector(root + "/outlier-ae/detector")
    return {"data": plain(loaded.predict(rows)["data"]), "meta": loaded.meta}


def gradients(root: str, model, rows: np.ndarray) -> dict:
    model.save(root + "/iris-ig/model.h5")
    explainer = IntegratedGradients(model, n_steps=20, method="gausslegendre")
    explainer.save(root + "/iris-ig/explainer")
    served = tf.keras.models.load_model(root + "/iris-ig/model.h5")
    loaded = load_explainer(root + "/iris-ig/explainer", predictor=served)
    target = served(rows).numpy().argmax(axis=1)  # MLServer's target: the predicted class
    fresh = IntegratedGradients(served, n_steps=10)  # as init_parameters build it
    return {
        "saved": json.loads(loaded.explain(rows, target=target).to_json()),
        "fresh": json.loads(fresh.explain(rows, target=target).to_json()),
        "target": target.tolist(),
        "first_class": json.loads(loaded.explain(rows, target=0).to_json()),
    }


def main() -> None:
    root, requests = sys.argv[1], json.loads(sys.argv[2])
    model, x = classifier()
    iris = np.asarray(requests.pop("iris"), dtype=np.float32)
    print(json.dumps({
        "numpy": np.__version__,
        "torch": torch.__version__,
        "tensorflow": tf.__version__,
        "mmd": mmd(root, requests, "pytorch", "mmd"),
        "mmd-tf": mmd(root, requests, "tensorflow", "mmd-tf"),
        "outlier-ae": outlier_ae(root, x, iris),
        "distillation": distillation(root, model, x, iris),
        "autoencoder": autoencoder(root, model, x, iris),
        "ig": gradients(root, model, iris),
    }))  # fmt: skip


main()
