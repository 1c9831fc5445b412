"""Tiny Spark models trained here, in the test process's own local Spark session, on
scikit-learn's bundled iris data, and saved as a repository: PipelineModels as plain
folders and in MLServer's layout, an RDD-based ``pyspark.mllib`` model in MLServer's
layout (``parameters.format``), and a broken pipeline."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

COLUMNS = ["sepal_length", "sepal_width", "petal_length", "petal_width"]
# Rows asked of every model (one of each species, then two in between).
ROWS = np.array(
    [
        [5.1, 3.5, 1.4, 0.2],
        [6.2, 2.9, 4.3, 1.3],
        [7.7, 3.0, 6.1, 2.3],
        [5.9, 3.0, 5.1, 1.8],
        [6.0, 2.2, 4.0, 1.0],
    ]
)
# The features of MLServer's mllib example (Spark's sample_libsvm_data.txt).
DOCS_FEATURES = 692
# The regression pipeline predicts petal_width from the other three columns.
REGRESSION_COLUMNS = COLUMNS[:3]


def spark_session() -> Any:
    """The test process's own local session (as the runtime's: loopback only, no UI)."""
    from pyspark.sql import SparkSession

    from inferpool.runtimes.spark_session import CONFIG

    builder = SparkSession.builder.master("local[1]").appName("inferpool-tests")
    for key, value in {**CONFIG, "spark.driver.memory": "512m"}.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def iris_frame(spark: Any) -> Any:
    from sklearn.datasets import load_iris

    X, y = load_iris(return_X_y=True)
    rows = [(*map(float, row), float(label)) for row, label in zip(X, y, strict=True)]
    return spark.createDataFrame(rows, [*COLUMNS, "label"])


def rows_frame(spark: Any, columns: list[str], rows: np.ndarray) -> Any:
    return spark.createDataFrame([tuple(float(v) for v in row) for row in rows], columns)


def build_repository(root: Path, spark: Any) -> dict[str, Any]:
    """Train and save the models under ``root``; each one's own answers for ROWS."""
    from pyspark.ml import Pipeline
    from pyspark.ml.classification import LogisticRegression
    from pyspark.ml.feature import VectorAssembler
    from pyspark.ml.regression import LinearRegression
    from pyspark.mllib.classification import LogisticRegressionWithLBFGS
    from pyspark.mllib.regression import LabeledPoint

    data = iris_frame(spark)
    classifier = Pipeline(
        stages=[
            VectorAssembler(inputCols=COLUMNS, outputCol="features"),
            LogisticRegression(maxIter=10),
        ]
    ).fit(data)
    classifier.save(str(root / "iris"))  # a plain folder: found by its metadata/
    regressor = Pipeline(
        stages=[
            VectorAssembler(inputCols=REGRESSION_COLUMNS, outputCol="features"),
            LinearRegression(labelCol="petal_width", solver="normal"),
        ]
    ).fit(data)
    regressor.save(str(root / "petal" / "pipeline"))
    _settings(root / "petal", "mlserver_mllib.MLlibModel", uri="./pipeline")
    rdd_model = save_iris_rdd(root / "iris-rdd", spark, data)
    # MLServer's own documentation example (docs/examples/mllib): a binary RDD-based
    # LogisticRegressionModel of 692 features saved at the folder's root, named by the
    # runtime's distribution ("mlserver-mllib", which MLServer cannot import), a version.
    features = np.random.default_rng(7).random((40, DOCS_FEATURES))
    labelled = [LabeledPoint(float(row[:5].sum() > 2.5), row) for row in features]
    docs_model = LogisticRegressionWithLBFGS.train(
        spark.sparkContext.parallelize(labelled), iterations=10
    )
    docs_model.save(spark.sparkContext, str(root / "spark-mllib"))
    (root / "spark-mllib" / "model-settings.json").write_text(
        json.dumps(
            {
                "name": "spark-mllib",
                "implementation": "mlserver-mllib.MLlibModel",
                "parameters": {"uri": "./", "format": "LogisticRegression", "version": "v0.1.0"},
            }
        )
    )
    # A pipeline whose classifier lost its coefficients: Spark itself refuses it.
    shutil.copytree(root / "iris", root / "broken")
    for data_folder in (root / "broken" / "stages").glob("*/data"):
        shutil.rmtree(data_folder)

    iris = classifier.transform(rows_frame(spark, COLUMNS, ROWS)).collect()
    petal = regressor.transform(rows_frame(spark, REGRESSION_COLUMNS, ROWS[:, :3])).collect()
    return {
        "iris": {
            "prediction": [row["prediction"] for row in iris],
            "probability": [row["probability"].toArray().tolist() for row in iris],
        },
        "petal": {"prediction": [row["prediction"] for row in petal]},
        "iris-rdd": {"predict": [float(rdd_model.predict(row)) for row in ROWS]},
        "spark-mllib": {
            "rows": features[:3].tolist(),
            "predict": [float(docs_model.predict(row)) for row in features[:3]],
        },
    }


def save_iris_rdd(folder: Path, spark: Any, data: Any) -> Any:
    """An RDD-based ``pyspark.mllib`` LogisticRegressionModel of iris's three species, in
    MLServer's layout (``model/`` and ``parameters.format``): the model."""
    from pyspark.mllib.classification import LogisticRegressionWithLBFGS
    from pyspark.mllib.regression import LabeledPoint

    points = [LabeledPoint(row[-1], row[:-1]) for row in data.collect()]
    model = LogisticRegressionWithLBFGS.train(
        spark.sparkContext.parallelize(points), iterations=10, numClasses=3
    )
    model.save(spark.sparkContext, str(folder / "model"))
    _settings(folder, "mlserver_mllib.MLlibModel", uri="./model", format="LogisticRegression")
    return model


def _settings(folder: Path, implementation: str, **parameters: str) -> None:
    settings = {"name": folder.name, "implementation": implementation, "parameters": parameters}
    (folder / "model-settings.json").write_text(json.dumps(settings))
