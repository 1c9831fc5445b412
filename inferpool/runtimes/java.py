"""The ``java`` runtime: a class of the model's jars implementing ``io.inferpool.Model``
(``java_interface/io/inferpool/Model.java``), called in this process's JVM (``jvm.py``).

Settings: ``"implementation": "java"``, ``parameters.uri`` a jar or a folder of jars (by
default the ``.jar`` files of the model's folder), ``parameters.extra.java_class`` the
class, ``parameters.extra.jvm_heap`` the JVM's ``-Xmx``. The class is loaded by a class
loader of its own over the model's jars (``jvm.class_loader``) and built with its public
constructor without arguments; its ``metadata()`` JSON, if any, gives the inputs and
outputs (settings win).

A request's rows cross as one flat primitive array (JPype copies a numpy buffer as a
block) that ``io.inferpool.Rows`` splits in Java; the answer comes back through JPype's
buffer view of the Java array: no per-value Python work. FP32 calls ``predict(float[][])``,
BYTES ``predict(String[])``, any other number ``predict(double[][])``. The answer is the
first output's ``[rows, columns]`` tensor. An ``IllegalArgumentException`` is the
client's fault (400 with its message); any other Java exception is a 500 with its class
and message.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jpype
import numpy as np

from inferpool.errors import BadRequest, ModelError, ModelLoadError
from inferpool.protocol.types import TensorSpec
from inferpool.runtimes import jvm
from inferpool.runtimes.base import Runtime
from inferpool.runtimes.load_errors import reading

LIBRARY = "Java"  # as load errors name it
DEFAULT_INPUT = TensorSpec("input-0", "FP64", [-1, -1])
DEFAULT_OUTPUT = TensorSpec("output-0", "FP64", [-1, -1])


class JavaInputError(ValueError):
    """An ``IllegalArgumentException`` out of the model: its input refused (a 400)."""


class JavaRuntime(Runtime):
    platform = "java"
    input_errors = (JavaInputError,)

    def load(self) -> None:
        extra = self.settings.parameters.extra
        class_name = extra.get("java_class")
        if not isinstance(class_name, str) or not class_name:
            raise ModelLoadError(
                f"model '{self.name}' names no class: set parameters.extra.java_class "
                "to the class implementing io.inferpool.Model"
            )
        self.jars = self._jars()
        # Only the jars are read here: the load probe stops at the end of this block,
        # before a JVM would start in its short-lived process.
        for jar in self.jars:
            with reading(jar, LIBRARY):
                if not zipfile.is_zipfile(jar):
                    raise ModelLoadError(f"{jar.name} is not a jar (not a zip archive)")
        heap = extra.get("jvm_heap")
        jvm.ensure_started(None if heap is None else str(heap))
        self.loader = jvm.class_loader(self.jars)
        self.model = self._instance(class_name)
        self.declared = self._declared(class_name)
        self.rows = jpype.JClass("io.inferpool.Rows")

    def _jars(self) -> list[Path]:
        """The jars named by ``uri`` (one jar, or a folder's), else the model folder's."""
        settings = self.settings
        folder = settings.resolve(settings.parameters.uri) if settings.parameters.uri else None
        if folder is not None and not folder.is_dir():
            if not folder.is_file():
                raise ModelLoadError(f"jar {folder} does not exist")
            return [folder]
        folder = folder or settings.folder
        jars = sorted(folder.glob("*.jar")) if folder is not None else []
        if not jars:
            raise ModelLoadError(f"model '{self.name}' has no jar: no .jar file in {folder}")
        return jars

    def _instance(self, class_name: str) -> Any:
        """The model's object, seen through the interface."""
        where = ", ".join(jar.name for jar in self.jars)
        try:
            cls = jpype.JClass(class_name, loader=self.loader)
        except (TypeError, jpype.JException):
            raise ModelLoadError(f"class '{class_name}' is not in {where}") from None
        interface = jpype.JClass(jvm.INTERFACE)
        if not interface.class_.isAssignableFrom(cls.class_):
            raise ModelLoadError(
                f"class '{class_name}' of {where} does not implement {jvm.INTERFACE}"
            )
        try:
            instance = cls()
        except (TypeError, jpype.JException) as exc:
            raise ModelLoadError(
                f"class '{class_name}' could not be built with a public constructor "
                f"without arguments: {jvm.java_message(exc)}"
            ) from None
        return jpype.JObject(instance, interface)

    def _declared(self, class_name: str) -> dict[str, list[TensorSpec]]:
        """The inputs and outputs the model's ``metadata()`` JSON declares."""
        try:
            text = self.model.metadata()
        except jpype.JException as exc:
            raise ModelLoadError(
                f"{class_name}.metadata() raised {jvm.java_message(exc)}"
            ) from None
        if text is None:
            return {}
        try:
            document = json.loads(str(text))
            return {
                key: [TensorSpec.from_dict(spec) for spec in document.get(key, [])]
                for key in ("inputs", "outputs")
            }
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ModelLoadError(
                f"{class_name}.metadata() is not V2 metadata JSON ({exc})"
            ) from None

    def unload(self) -> None:
        self.loader.close()

    def predictor(self) -> str:
        version = jpype.JClass("java.lang.System").getProperty("java.version")
        return f"{self.settings.parameters.extra['java_class']} on Java {version} (JPype)"

    def inputs(self) -> list[TensorSpec]:
        return super().inputs() or self.declared.get("inputs") or [DEFAULT_INPUT]

    def outputs(self) -> list[TensorSpec]:
        return self.settings.output_specs() or self.declared.get("outputs") or [DEFAULT_OUTPUT]

    def predict(self, payload: Any, outputs: Sequence[str]) -> Mapping[str, Any]:
        values = np.asarray(payload)
        try:
            strings = values.dtype.kind in "OSU"
            answer = self._strings(values) if strings else self._numbers(values)
        except jpype.JException as exc:
            if isinstance(exc, jpype.JClass("java.lang.IllegalArgumentException")):
                raise JavaInputError(str(exc.getMessage())) from None
            raise ModelError(f"model '{self.name}' raised {jvm.java_message(exc)}") from None
        return {outputs[0]: answer}

    def _numbers(self, values: np.ndarray) -> np.ndarray:
        rows = values.reshape(len(values), -1) if values.ndim != 2 else values
        if rows.dtype == np.float32:
            flat = jpype.JArray(jpype.JFloat)(np.ascontiguousarray(rows).ravel())
        else:
            flat = jpype.JArray(jpype.JDouble)(np.ascontiguousarray(rows, np.float64).ravel())
        answer = self.model.predict(self.rows.split(flat, rows.shape[1]))
        if answer is None:
            raise ModelError(f"model '{self.name}' answered null")
        try:
            result = np.asarray(answer)
        except (ValueError, TypeError):
            raise ModelError(f"model '{self.name}' answered rows of different lengths") from None
        if len(result) != len(rows):
            raise ModelError(f"model '{self.name}' answered {len(result)} rows for {len(rows)}")
        return result

    def _strings(self, values: np.ndarray) -> np.ndarray:
        if values.ndim != 1 and values.shape[1:] != (1,):
            raise BadRequest(f"model '{self.name}' takes one string per row")
        texts = [v.decode() if isinstance(v, bytes) else str(v) for v in values.ravel()]
        answer = self.model.predict(jpype.JArray(jpype.JString)(texts))
        if answer is None:
            raise ModelError(f"model '{self.name}' answered null")
        return np.array([str(text) for text in answer], dtype=object)
