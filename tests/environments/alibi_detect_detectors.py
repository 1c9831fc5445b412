"""Run by the alibi-detect environment's python (tests/environments/test_alibi_detect.py),
not by pytest: saves the detectors the test serves into the repository folder given as
its first argument, and prints, as one JSON line, what they answer in that environment
to the requests given (JSON) as its second argument.

Config detectors are saved with ``save_detector`` and their answers are those of the
detector ``load_detector`` loads back. alibi-detect 0.13's ``save_detector`` writes
IForest, Mahalanobis and SpectralResidual only in its legacy format, and only with
TensorFlow installed (which the environment lacks): ``save_legacy`` writes that format
as ``save_detector`` does, the detector's meta in meta.dill and the state alibi-detect
keeps for it in <name>.dill (its ``state_iforest``, ``state_mahalanobis`` and
``state_sr``; checked 2026-12-07 with TensorFlow 2.18.1 and tf-keras 2.18.0: folders
save_detector wrote hold these files and keys, and the runtime, without TensorFlow, loads
them into detectors answering as alibi-detect's own load_detector's; SpectralResidual's
scores bit for bit). Their answers are the saved detector's own, in memory.
"""

import copy
import json
import os
import sys

import dill
import numpy as np
from alibi_detect.cd import (
    ChiSquareDrift,
    ClassifierDrift,
    CVMDrift,
    CVMDriftOnline,
    FETDrift,
    FETDriftOnline,
    KSDrift,
    TabularDrift,
)
from alibi_detect.od import IForest, Mahalanobis, SpectralResidual
from alibi_detect.saving import load_detector, save_detector
from sklearn.linear_model import LogisticRegression

# What alibi-detect 0.13's legacy saving keeps of each detector.
KEPT = {
    "IForest": ("threshold", "isolationforest"),
    "Mahalanobis": ("threshold", "n_components", "std_clip", "start_clip", "max_n",
                    "cat_vars", "ohe", "d_abs", "clip", "mean", "C", "n"),
    "SpectralResidual": ("threshold", "window_amp", "window_local", "n_est_points",
                         "n_grad_points"),
}  # fmt: skip
CATEGORIES = [0.4, 0.3, 0.2, 0.1]  # the reference data's category frequencies


def plain(data: dict) -> dict:
    """The detector's data as JSON; None for what no tensor holds (None, or an object)."""
    return {
        k: None if v is None or np.asarray(v).dtype == object else np.asarray(v).tolist()
        for k, v in data.items()
    }


def save_legacy(detector, folder: str) -> None:
    os.makedirs(folder)
    name = detector.meta["name"]
    with open(folder + "/meta.dill", "wb") as f:
        dill.dump(detector.meta, f)
    with open(folder + "/" + name + ".dill", "wb") as f:
        dill.dump({key: getattr(detector, key) for key in KEPT[name]}, f)


def outliers(root: str, x_ref: np.ndarray, arrays: dict) -> dict:
    # IForest gives its IsolationForest no random_state: scikit-learn draws from numpy's
    # global generator, seeded here so that the forest (and which shifted rows it flags,
    # some but not all: the test's premise) is the same at every run.
    np.random.seed(0)
    forest = IForest(n_estimators=50)
    forest.fit(x_ref)
    forest.infer_threshold(x_ref, threshold_perc=95)
    save_legacy(forest, root + "/iforest/detector")
    # Mahalanobis updates its mean and covariance at each predict (infer_threshold too).
    distance = Mahalanobis(n_components=3, start_clip=50)
    distance.infer_threshold(x_ref, threshold_perc=95)
    save_legacy(distance, root + "/mahalanobis/detector")
    fresh = copy.deepcopy(distance)
    same, shifted = arrays["same"][:10], arrays["shifted"][:10]
    return {
        "iforest": {name: plain(forest.predict(rows)["data"]) for name, rows in arrays.items()},
        "iforest_meta": forest.meta,
        "no_score": plain(forest.predict(arrays["shifted"], return_instance_score=False)["data"]),
        "mahalanobis": [plain(distance.predict(rows)["data"]) for rows in (same, shifted)],
        "mahalanobis_fresh": plain(fresh.predict(shifted)["data"]),
    }


def spectral(root: str, series: dict) -> dict:
    """SpectralResidual (a time series' outliers), its threshold from a calm series; saved
    with the constructor's default paddings, which alibi-detect's loader restores."""
    generator = np.random.default_rng(20)
    steps = np.arange(400)
    calm = np.sin(2 * np.pi * steps / 50) + 0.1 * generator.normal(size=400)
    detector = SpectralResidual(window_amp=20, window_local=20, n_est_points=10, n_grad_points=5)
    detector.infer_threshold(calm.astype(np.float32), threshold_perc=99)
    save_legacy(detector, root + "/spectral/detector")
    values = {name: np.asarray(points, dtype=np.float32) for name, points in series.items()}
    return {
        "answers": {name: plain(detector.predict(x)["data"]) for name, x in values.items()},
        "no_score": plain(detector.predict(values["spiked"], return_instance_score=False)["data"]),
        "meta": detector.meta,
    }


def drift(root: str, requests: dict) -> dict:
    """The univariate drift detectors beside KSDrift that compute with numpy and scipy, and
    ClassifierDrift with scikit-learn's backend, saved and loaded back (config.toml); each
    answers its data's two requests, in turn (TabularDrift with ``update_x_ref`` answers
    the second against updated reference data)."""
    generator = np.random.default_rng(10)
    mixed = np.column_stack(
        [generator.choice(4, size=200, p=CATEGORIES), generator.normal(size=(200, 2))]
    ).astype(np.float32)
    detectors = {
        "chisquare": ChiSquareDrift(generator.choice(4, size=(200, 3), p=CATEGORIES)),
        "tabular": TabularDrift(mixed, categories_per_feature={0: 4}),
        "tabular-updated": TabularDrift(
            mixed, categories_per_feature={0: 4}, update_x_ref={"last": 100}
        ),
        "fet": FETDrift(generator.choice(2, size=(200, 3), p=[0.7, 0.3])),
        "cvm": CVMDrift(generator.normal(size=(200, 4)).astype(np.float32)),
        # scikit-learn's backend: trained anew at each predict (seed 0: the same folds).
        "classifier": ClassifierDrift(
            generator.normal(size=(200, 4)).astype(np.float32),
            model=LogisticRegression(),
            backend="sklearn",
            n_folds=3,
        ),
    }
    answers = {}
    for name, detector in detectors.items():
        save_detector(detector, root + "/" + name + "/detector")
        loaded = load_detector(root + "/" + name + "/detector")
        data = requests[name.removesuffix("-updated")]
        dtype = np.int64 if data["datatype"] == "INT64" else np.float32
        steps = [np.asarray(data[step], dtype=dtype) for step in ("same", "shifted")]
        answers[name] = [plain(loaded.predict(x)["data"]) for x in steps]
    # ClassifierDrift's answer holds its trained model too (no tensor: plain makes it None).
    classifier = load_detector(root + "/classifier/detector")
    rows = np.float32(requests["classifier"]["same"])
    answers["classifier_keys"] = list(classifier.predict(rows)["data"])
    return answers


def fet_online(root: str, rows: list) -> list:
    """FETDriftOnline (0s and 1s), fed one request's rows as the server feeds an online
    detector: one predict per row."""
    generator = np.random.default_rng(30)
    x_ref = generator.choice(2, size=(200, 2), p=[0.7, 0.3])
    # Its default n_bootstraps (10000): with 300, a quarter of its loads fail at random
    # (the simulation drawing its thresholds runs out of streams: "p is NaN"); with 1000,
    # 2 in 200; with 10000, none in 300 (60 ms each).
    detector = FETDriftOnline(x_ref, ert=50, window_sizes=[4], verbose=False)
    save_detector(detector, root + "/fet-online/detector")
    loaded = load_detector(root + "/fet-online/detector")
    return [plain(loaded.predict(x)["data"]) for x in np.asarray(rows, dtype=np.int64)]


def main(root: str, requests: dict) -> dict:
    rng = np.random.default_rng(0)
    x_ref = rng.normal(size=(200, 4)).astype(np.float32)
    save_detector(KSDrift(x_ref, p_val=0.05), root + "/ksdrift/detector")
    detector = load_detector(root + "/ksdrift/detector")
    arrays = {name: np.asarray(requests[name], dtype=np.float32) for name in ("same", "shifted")}
    answers = {name: detector.predict(rows) for name, rows in arrays.items()}
    feature = detector.predict(arrays["shifted"], return_distance=False)
    joined = np.concatenate([arrays["same"], arrays["shifted"]])
    # An online detector, fed as the server feeds it: a request of several rows is one
    # predict per row (each of shape [features]), a request of one row one predict.
    save_detector(
        CVMDriftOnline(x_ref[:100, :2], ert=50, window_sizes=[2], n_bootstraps=300, verbose=False),
        root + "/online/detector",
    )
    online = load_detector(root + "/online/detector")
    stream = [
        [plain(online.predict(x)["data"]) for x in arrays["same"][:3, :2]],
        [plain(online.predict(arrays["shifted"][:1, :2])["data"])],
    ]
    return {
        "numpy": np.__version__,
        "online": stream,
        "answers": {name: plain(a["data"]) for name, a in answers.items()},
        "meta": answers["same"]["meta"],
        "no_distance": plain(feature["data"]),
        "joined": plain(detector.predict(joined)["data"]),
        "outliers": outliers(root, x_ref, arrays),
        "spectral": spectral(root, requests["series"]),
        "drift": drift(root, requests["drift"]),
        "fet_online": fet_online(root, requests["binary_stream"]),
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], json.loads(sys.argv[2]))))
