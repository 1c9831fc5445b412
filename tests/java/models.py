"""The models of the java tests, made here: Java classes compiled with javac against
inferpool's interface jar into jars of their own, and scikit-learn pipelines exported to
PMML with sklearn2pmml. ``java_answers`` runs a model class in a plain ``java`` process
(Java's own call on the same rows) to compare the server's answers with."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import numpy as np

import inferpool.runtimes

# runtimes/jvm.py's INTERFACE_JAR, found without importing JPype (collected everywhere)
INTERFACE_JAR = Path(inferpool.runtimes.__file__).parent / "java_interface" / "inferpool-model.jar"

WEIGHTS = (1.5, -2.0, 0.25)
# A linear model of 3 features with metadata; a wrong width is an IllegalArgumentException
# (400), a first value of -999 an IllegalStateException (500).
LINEAR = """
package demo;

public class Linear implements io.inferpool.Model {
    static final double[] W = {1.5, -2.0, 0.25};

    public double[][] predict(double[][] batch) {
        double[][] out = new double[batch.length][1];
        for (int i = 0; i < batch.length; i++) {
            if (batch[i].length != W.length) {
                throw new IllegalArgumentException("expected 3 features, got " + batch[i].length);
            }
            if (batch[i][0] == -999) {
                throw new IllegalStateException("the model broke on row " + i);
            }
            double sum = 0.5;
            for (int j = 0; j < W.length; j++) {
                sum += W[j] * batch[i][j];
            }
            out[i][0] = sum;
        }
        return out;
    }

    public String metadata() {  // JSON, its quotes written as ' here
        return ("{'inputs': [{'name': 'x', 'datatype': 'FP64', 'shape': [-1, 3]}],"
            + " 'outputs': [{'name': 'y', 'datatype': 'FP64', 'shape': [-1, 1]}]}")
            .replace('\\'', '"');
    }
}
"""
# Strings in, strings out; no metadata.
UPPER = """
package demo;

public class Upper implements io.inferpool.Model {
    public double[][] predict(double[][] batch) {
        throw new IllegalArgumentException("this model takes strings");
    }

    public String[] predict(String[] batch) {
        String[] out = new String[batch.length];
        for (int i = 0; i < batch.length; i++) {
            out[i] = batch[i].toUpperCase();
        }
        return out;
    }
}
"""
# In a jar of its own, loaded after the JVM started: squares, FP32 kept FP32.
SQUARE = """
package other;

public class Square implements io.inferpool.Model {
    public double[][] predict(double[][] batch) {
        double[][] out = new double[batch.length][];
        for (int i = 0; i < batch.length; i++) {
            out[i] = new double[batch[i].length];
            for (int j = 0; j < batch[i].length; j++) {
                out[i][j] = batch[i][j] * batch[i][j];
            }
        }
        return out;
    }
}
"""
NOT_A_MODEL = """
package demo;

public class NotAModel {
    public double[][] predict(double[][] batch) {
        return batch;
    }
}
"""
# Java's own call: the rows of stdin (numbers separated by spaces) through the class.
MAIN = """
package demo;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.ArrayList;
import java.util.List;

public class Main {
    public static void main(String[] args) throws Exception {
        io.inferpool.Model model = (io.inferpool.Model) Class.forName(args[0])
            .getDeclaredConstructor().newInstance();
        List<double[]> rows = new ArrayList<>();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        for (String line = in.readLine(); line != null; line = in.readLine()) {
            String[] parts = line.trim().split(" ");
            double[] row = new double[parts.length];
            for (int j = 0; j < parts.length; j++) {
                row[j] = Double.parseDouble(parts[j]);
            }
            rows.add(row);
        }
        for (double[] answer : model.predict(rows.toArray(new double[0][]))) {
            StringBuilder line = new StringBuilder();
            for (double value : answer) {
                line.append(Double.toString(value)).append(' ');
            }
            System.out.println(line.toString().trim());
        }
    }
}
"""


def compile_jar(jar: Path, sources: dict[str, str]) -> Path:
    """``sources`` (``package/Class`` → Java source) compiled into ``jar``."""
    work = jar.parent / f".{jar.stem}-build"
    for name, source in sources.items():
        path = work / "src" / f"{name}.java"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    files = [str(p) for p in (work / "src").rglob("*.java")]
    classes = work / "classes"
    subprocess.run(
        ["javac", "--release", "11", "-cp", str(INTERFACE_JAR), "-d", str(classes), *files],
        check=True,
    )
    jar.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["jar", "--create", "--file", str(jar), "-C", str(classes), "."], check=True)
    return jar


def write_java_model(folder: Path, class_name: str, jar: Path | None = None, **extra) -> Path:
    """A model folder whose settings name ``class_name`` of ``jar`` (by default the
    folder's own jars)."""
    folder.mkdir(parents=True, exist_ok=True)
    parameters: dict = {"extra": {"java_class": class_name, **extra}}
    if jar is not None:
        parameters["uri"] = str(jar)
    document = {"name": folder.name, "implementation": "java", "parameters": parameters}
    (folder / "model-settings.json").write_text(json.dumps(document))
    return folder


def java_repository(root: Path) -> Path:
    """linear, upper (one jar, the folder's own), square (a jar of its own, named by uri)."""
    jar = compile_jar(
        root / "linear" / "demo.jar",
        {
            "demo/Linear": LINEAR,
            "demo/Upper": UPPER,
            "demo/Main": MAIN,
            "demo/NotAModel": NOT_A_MODEL,
        },
    )
    write_java_model(root / "linear", "demo.Linear", jvm_heap="64m")
    write_java_model(root / "upper", "demo.Upper", jar=jar)
    other = compile_jar(root / "jars" / "other.jar", {"other/Square": SQUARE})
    write_java_model(root / "square", "other.Square", jar=other)
    return root


def java_answers(jar: Path, class_name: str, rows: np.ndarray) -> np.ndarray:
    """What ``class_name`` answers for ``rows`` in a plain ``java`` process."""
    classpath = f"{jar}:{INTERFACE_JAR}"
    text = "\n".join(" ".join(repr(float(v)) for v in row) for row in rows)
    done = subprocess.run(
        ["java", "-cp", classpath, "demo.Main", class_name],
        input=text,
        capture_output=True,
        text=True,
        check=True,
    )
    return np.array([[float(v) for v in line.split()] for line in done.stdout.splitlines()])


IRIS_COLUMNS = ["sepal_length", "sepal_width", "petal_length", "petal_width"]
REGRESSION_COLUMNS = ["a", "b", "c"]


def export_pmml(pipeline, path: Path) -> Path:
    """``pipeline`` (a fitted PMMLPipeline) written to ``path`` by sklearn2pmml."""
    import sklearn.base
    from sklearn2pmml import sklearn2pmml

    # sklearn2pmml's converter refuses a pickle of a scikit-learn newer than those it was
    # tested with (1.9.0 for 0.133), even a patch release: the estimators these tests
    # export (LogisticRegression, DecisionTree, LinearRegression) are unchanged since, so
    # their pickles say 1.9.0 when newer.
    version = sklearn.base.__version__
    if tuple(int(p) for p in version.split(".")[:2]) >= (1, 9):
        sklearn.base.__version__ = "1.9.0"
    try:
        sklearn2pmml(pipeline, str(path))
    finally:
        sklearn.base.__version__ = version
    return path


def pmml_repository(root: Path, names: list[str] | None = None) -> dict[str, tuple[Path, Any]]:
    """iris-logreg, iris-tree (classifiers with probabilities) and linreg (a regressor),
    each a folder with its model.pmml; returns each one's file and some rows (a DataFrame
    of the columns it was fitted on: a tree's document keeps only those it uses)."""
    import pandas as pd
    from sklearn.datasets import load_iris, make_regression
    from sklearn.linear_model import LinearRegression, LogisticRegression
    from sklearn.tree import DecisionTreeClassifier
    from sklearn2pmml.pipeline import PMMLPipeline

    X, y = load_iris(return_X_y=True)
    iris = pd.DataFrame(X, columns=IRIS_COLUMNS)
    target = pd.Series(np.array(["setosa", "versicolor", "virginica"])[y], name="species")
    Xr, yr = make_regression(120, 3, noise=0.5, random_state=0)
    regression = pd.DataFrame(Xr, columns=REGRESSION_COLUMNS)
    made = {}
    for name, estimator, data, labels in (
        ("iris-logreg", LogisticRegression(max_iter=1000), iris, target),
        ("iris-tree", DecisionTreeClassifier(max_depth=3, random_state=0), iris, target),
        ("linreg", LinearRegression(), regression, pd.Series(yr, name="y")),
    ):
        if names is not None and name not in names:
            continue
        pipeline = PMMLPipeline([("model", estimator)]).fit(data, labels)
        (root / name).mkdir(parents=True, exist_ok=True)
        path = export_pmml(pipeline, root / name / "model.pmml")
        made[name] = (path, data.iloc[::7])
    return made


def post(server: Any, model: str, body: dict) -> Any:
    """``body`` posted to ``model``'s V2 REST infer route of a live ``Server``."""
    import httpx

    return httpx.post(f"{server.url}/v2/models/{model}/infer", json=body, timeout=60)
