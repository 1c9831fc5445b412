"""The Spark MLlib runtime: a ``PipelineModel`` saved with ``.save(path)`` (a folder with
Spark's ``metadata/`` and ``stages/``), transformed in this process's local Spark session
(``spark_session.py``: one per worker, started after the fork).

The metadata is the saved pipeline's, read from its stages' metadata without Spark: the
inputs are the columns its stages read that no earlier stage writes (numbers as FP64
``[-1]``; text as BYTES for the stages that read text; a vector column read by a
predictor or a vector stage as one FP64 ``[-1, features]`` tensor), the outputs the last
predictor's prediction column (FP64 ``[-1]``) and its probability column where it has one
(FP64 ``[-1, classes]``). A request gives the columns by name (a V2 request's inputs or a
``pd`` request's columns), or one ``[rows, columns]`` tensor whose columns are the inputs
in order; the rows become a Spark DataFrame of the saved input columns, and the answers
are the pipeline's own ``transform``.

Settings naming ``mlserver_mllib.MLlibModel`` get MLServer 1.7.1's runtime: the RDD-based
``pyspark.mllib`` model that ``parameters.format`` names (``LogisticRegression``,
``RandomForest``...) loaded from ``parameters.uri``, whose ``predict`` answers ``predict``
(FP32, one value per row: ``[1]`` for MLServer's one-row request). Without a format, a
folder holding a PipelineModel is served as above.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pyspark.ml import PipelineModel  # no JVM yet: the session starts at the first load

from inferpool.errors import BadRequest, ModelError, ModelLoadError
from inferpool.protocol.types import TensorSpec
from inferpool.runtimes import spark_session
from inferpool.runtimes.base import Runtime
from inferpool.runtimes.load_errors import reading
from inferpool.runtimes.mlserver_outputs import mlserver_flavour
from inferpool.runtimes.tabular import is_dataframe

LIBRARY = "Spark MLlib"  # as load errors name it
PIPELINE = "org.apache.spark.ml.PipelineModel"
# Stages whose input columns hold text (the rest read numbers or vectors).
TEXT_READERS = ("StringIndexerModel", "Tokenizer", "RegexTokenizer", "IndexToString")
# Stages whose input column is a vector (as a predictor's featuresCol is).
VECTOR_READERS = (
    "StandardScalerModel",
    "MinMaxScalerModel",
    "MaxAbsScalerModel",
    "PCAModel",
    "Normalizer",
    "VectorIndexerModel",
    "VectorSlicer",
    "ElementwiseProduct",
)
READS = ("inputCol", "inputCols", "featuresCol")
WRITES = ("outputCol", "outputCols", "predictionCol", "probabilityCol", "rawPredictionCol")
# MLServer's ``parameters.format`` names: the pyspark.mllib class each loads.
MLSERVER_FORMATS = {
    "LogisticRegression": "classification.LogisticRegressionModel",
    "NaiveBayes": "classification.NaiveBayesModel",
    "SVM": "classification.SVMModel",
    "KMeans": "clustering.KMeansModel",
    "IsotonicRegression": "regression.IsotonicRegressionModel",
    "LinearRegression": "regression.LinearRegressionModel",
    "Lasso": "regression.LassoModel",
    "RidgeRegression": "regression.RidgeRegressionModel",
    "DecisionTree": "tree.DecisionTreeModel",
    "GradientBoostedTrees": "tree.GradientBoostedTreesModel",
    "RandomForest": "tree.RandomForestModel",
}


def model_folder(runtime: Runtime) -> Path:
    """The saved model's folder: ``parameters.uri`` (a folder), else the model's own."""
    settings = runtime.settings
    folder = settings.resolve(settings.parameters.uri) if settings.parameters.uri else None
    folder = folder or settings.folder
    if folder is None:
        raise ModelLoadError(f"model '{runtime.name}' names no uri and has no folder")
    if not folder.is_dir():
        raise ModelLoadError(f"Spark model folder {folder} does not exist")
    return folder


class MLlibRuntime(Runtime):
    platform = "mllib"
    accepts = "dict"

    def load(self) -> None:
        if mlserver_flavour(self.settings, "mllib") and _format(self) is not None:
            self.successor: Runtime = MLServerMLlibRuntime(self.settings)
            self.successor.load()
            return
        folder = model_folder(self)
        # Only the metadata is read here: the load probe stops at the end of this block,
        # before Spark would start in its short-lived process.
        with reading(folder / "metadata", LIBRARY):
            document = spark_session.read_metadata(folder)
            if document["class"] != PIPELINE:
                raise ModelLoadError(
                    f"{folder} holds a {document['class']}, not a PipelineModel: save the "
                    "fitted Pipeline (PipelineModel.save), or name its format in "
                    "parameters.format with mlserver_mllib.MLlibModel"
                )
            stages = spark_session.stage_documents(folder, document)
            self.columns, self.results = _schema(folder, stages)
        spark = spark_session.session(_heap(self))
        try:
            self.model = PipelineModel.load(str(folder))
        except Exception as exc:
            raise ModelLoadError(
                f"{folder} is not a PipelineModel Spark can load ({spark_session.reason(exc)})"
            ) from None
        self.spark = spark
        self._sizes_from_stages()

    def _sizes_from_stages(self) -> None:
        """The vector widths and class counts the loaded stages know."""
        predictors = [s for s in self.model.stages if hasattr(s, "numFeatures")]
        if not predictors:
            return
        last = predictors[-1]
        for index, (name, kind, width) in enumerate(self.columns):
            if kind == "vector" and width < 0:
                self.columns[index] = (name, kind, int(last.numFeatures))
        classes = int(getattr(last, "numClasses", -1) or -1)
        self.results = [
            TensorSpec(spec.name, spec.datatype, [-1, classes]) if len(spec.shape) == 2 else spec
            for spec in self.results
        ]

    def serving(self) -> Runtime:
        return getattr(self, "successor", self)

    def predictor(self) -> str:
        stages = ", ".join(type(stage).__name__ for stage in self.model.stages)
        return f"Spark {self.spark.version} local session: {stages}"

    def inputs(self) -> list[TensorSpec]:
        declared = super().inputs()
        if declared:
            return declared
        return [_column_spec(name, kind, width) for name, kind, width in self.columns]

    def outputs(self) -> list[TensorSpec]:
        return self.settings.output_specs() or self.results

    def default_outputs(self) -> list[str]:
        return [spec.name for spec in self.results]

    def validate(self, payload: Any) -> None:
        self._values(payload)

    def predict(self, payload: Any, outputs: Sequence[str]) -> Mapping[str, Any]:
        frame = self._frame(self._values(payload))
        wanted = [name for name in outputs if name in {s.name for s in self.results}]
        try:
            rows = self.model.transform(frame).select(*wanted).collect()
        except Exception as exc:
            raise ModelError(f"model '{self.name}' raised {spark_session.reason(exc)}") from None
        return {name: _column(rows, i) for i, name in enumerate(wanted)}

    def _values(self, payload: Any) -> list[np.ndarray]:
        """Each input column's values (a vector column as ``[rows, width]``), from a
        payload by name or from one tensor whose columns are the inputs in order."""
        if is_dataframe(payload):
            payload = {str(c): payload[c].to_numpy() for c in payload.columns}
        names = [name for name, _, _ in self.columns]
        expected = ", ".join(repr(name) for name in names)
        if len(payload) == 1 and not set(payload) & set(names):
            (value,) = payload.values()
            return self._by_position(np.asarray(value), expected)
        missing = [repr(name) for name in names if name not in payload]
        if missing:
            raise BadRequest(
                f"model '{self.name}' is missing input {', '.join(missing)}; expected: {expected}"
            )
        values = [np.asarray(payload[name]) for name in names]
        rows = {len(value) if value.ndim else 1 for value in values}
        if len(rows) > 1:
            raise BadRequest(f"model '{self.name}': inputs {expected} differ in rows")
        pairs = zip(values, self.columns, strict=True)
        return [self._shaped(value, column) for value, column in pairs]

    def _by_position(self, value: np.ndarray, expected: str) -> list[np.ndarray]:
        if len(self.columns) == 1 and self.columns[0][1] == "vector":
            return [self._shaped(value, self.columns[0])]
        rows = value.reshape(len(value), -1) if value.ndim != 2 else value
        if rows.shape[1] != len(self.columns):
            raise BadRequest(
                f"model '{self.name}' takes {len(self.columns)} columns ({expected}), "
                f"got {rows.shape[1]}"
            )
        return [rows[:, i] for i in range(rows.shape[1])]

    def _shaped(self, value: np.ndarray, column: tuple[str, str, int]) -> np.ndarray:
        name, kind, width = column
        if kind != "vector":
            return value.reshape(-1)
        rows = value.reshape(len(value), -1) if value.ndim != 2 else value
        if width >= 0 and rows.shape[1] != width:
            raise BadRequest(
                f"model '{self.name}' takes {width} features in '{name}', got {rows.shape[1]}"
            )
        return rows

    def _frame(self, values: list[np.ndarray]) -> Any:
        """The rows as a Spark DataFrame of the saved input columns."""
        from pyspark.ml.linalg import DenseVector, VectorUDT
        from pyspark.sql.types import DoubleType, StringType, StructField, StructType

        fields, columns = [], []
        for (name, kind, _), value in zip(self.columns, values, strict=True):
            if kind == "vector":
                fields.append(StructField(name, VectorUDT()))
                columns.append([DenseVector(row) for row in value.astype(np.float64)])
            elif kind == "text":
                fields.append(StructField(name, StringType()))
                columns.append([_text(v) for v in value.tolist()])
            else:
                fields.append(StructField(name, DoubleType()))
                try:
                    columns.append(value.astype(np.float64).tolist())
                except ValueError:
                    message = f"model '{self.name}': input '{name}' is not numeric"
                    raise BadRequest(message) from None
        return self.spark.createDataFrame(list(zip(*columns, strict=True)), StructType(fields))


class MLServerMLlibRuntime(Runtime):
    """MLServer 1.7.1's ``mlserver_mllib.MLlibModel``: the ``pyspark.mllib`` model of
    ``parameters.format``; each row of the first input predicted, answered as ``predict``
    (FP32)."""

    platform = "mllib"
    accepts = "dict"  # MLServer's runtime refuses more than one input tensor
    open_outputs = True

    def load(self) -> None:
        import importlib

        folder = model_folder(self)
        name = _format(self) or ""
        target = MLSERVER_FORMATS.get(name)
        if target is None:
            known = ", ".join(MLSERVER_FORMATS)
            raise ModelLoadError(
                f"Invalid MLlib format for model {self.name}: parameters.format is "
                f"{name!r}, not one of {known}"
            )
        with reading(folder / "metadata", LIBRARY):
            spark_session.read_metadata(folder)
        spark = spark_session.session(_heap(self))
        module, _, cls = f"pyspark.mllib.{target}".rpartition(".")
        try:
            self.model = getattr(importlib.import_module(module), cls).load(
                spark.sparkContext, str(folder)
            )
        except Exception as exc:
            raise ModelLoadError(
                f"{folder} is not a {name} model Spark can load ({spark_session.reason(exc)})"
            ) from None

    def outputs(self) -> list[TensorSpec]:
        return self.settings.output_specs() or [TensorSpec("predict", "FP32", [-1])]

    def predict(self, payload: Any, outputs: Sequence[str]) -> Mapping[str, Any]:
        if len(payload) != 1:
            raise BadRequest(
                f"MLlibModel only supports a single input tensor ({len(payload)} were received)"
            )
        (value,) = payload.values()
        value = np.asarray(value, dtype=np.float64)
        rows = value.reshape(len(value), -1) if value.ndim == 2 else value.reshape(1, -1)
        try:
            predictions = [float(self.model.predict(row)) for row in rows]
        except Exception as exc:
            raise ModelError(f"model '{self.name}' raised {spark_session.reason(exc)}") from None
        return {"predict": np.asarray(predictions, dtype=np.float32)}


def _format(runtime: Runtime) -> str | None:
    """MLServer's ``parameters.format`` (a field of MLServer's parameters block)."""
    extra = runtime.settings.parameters.model_extra or {}
    value = extra.get("format") or runtime.settings.parameters.extra.get("format")
    return str(value) if value else None


def _heap(runtime: Runtime) -> str | None:
    heap = runtime.settings.parameters.extra.get("jvm_heap")
    return None if heap is None else str(heap)


def _schema(
    folder: Path, stages: list[tuple[str, dict[str, Any]]]
) -> tuple[list[tuple[str, str, int]], list[TensorSpec]]:
    """The pipeline's input columns (name, kind, vector width or -1) and its outputs, from
    its stages' metadata: columns read before any stage writes them, and the last
    predictor's prediction and probability columns."""
    written: set[str] = set()
    columns: list[tuple[str, str, int]] = []
    results: list[TensorSpec] = []
    for cls, stage in stages:
        simple = cls.rpartition(".")[2]
        for key in READS:
            names = stage.get(key)
            for name in [names] if isinstance(names, str) else names or []:
                if name in written or any(name == c[0] for c in columns):
                    continue
                vector = key == "featuresCol" or simple in VECTOR_READERS
                kind = "vector" if vector else "text" if simple in TEXT_READERS else "number"
                columns.append((name, kind, -1))
        for key in WRITES:
            names = stage.get(key)
            written.update([names] if isinstance(names, str) else names or [])
        if stage.get("predictionCol"):
            results = [TensorSpec(stage["predictionCol"], "FP64", [-1])]
            if stage.get("probabilityCol"):
                results.append(TensorSpec(stage["probabilityCol"], "FP64", [-1, -1]))
    if not columns or not results:
        what = "reads no input column" if not columns else "has no predictor stage"
        raise ModelLoadError(f"the PipelineModel in {folder} {what}")
    return columns, results


def _column_spec(name: str, kind: str, width: int) -> TensorSpec:
    if kind == "vector":
        return TensorSpec(name, "FP64", [-1, width])
    return TensorSpec(name, "BYTES" if kind == "text" else "FP64", [-1])


def _column(rows: list[Any], index: int) -> np.ndarray:
    """One column of the collected rows: numbers as FP64, vectors as ``[rows, width]``."""
    values = [row[index] for row in rows]
    if values and hasattr(values[0], "toArray"):
        return np.stack([value.toArray() for value in values])
    return np.asarray(values, dtype=np.float64)


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value
