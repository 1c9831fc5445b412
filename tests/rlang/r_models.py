"""R models for the R runtime's tests, trained here by Rscript (lm, glm binomial,
randomForest), each saved as ``model.rds`` in a model folder, with rows to send and what
R's own ``predict`` answers for them (written by the same R process, 17 digits)."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# What the models are fitted on and asked about: three numeric columns a, b, c (c > 0).
TRAIN = r"""
set.seed(1)
n <- 200
d <- data.frame(a = rnorm(n), b = rnorm(n), c = runif(n, 0.1, 2))
d$y <- 2 * d$a - d$b + 0.5 * log(d$c) + rnorm(n, sd = 0.1)
d$z <- as.integer(d$a + d$b + rnorm(n) > 0)
d$k <- factor(ifelse(d$a > 0.5, "high", ifelse(d$a < -0.5, "low", "mid")))
set.seed(2)
rows <- data.frame(a = rnorm(20), b = rnorm(20), c = runif(20, 0.1, 2))
out <- function(name, x) writeLines(sprintf("%.17g", as.vector(t(as.matrix(x)))),
                                    file.path(root, paste0(name, ".txt")))
labels <- function(name, x) writeLines(as.character(x), file.path(root, paste0(name, ".txt")))
out("rows", rows)
save <- function(name, model) {
  dir.create(file.path(root, name))
  saveRDS(model, file.path(root, name, "model.rds"))
}
linear <- lm(y ~ a + b + log(c), data = d)
save("r-lm", linear)
out("r-lm", predict(linear, newdata = rows))
logistic <- glm(z ~ a + b, data = d, family = binomial)
save("r-glm", logistic)
out("r-glm", predict(logistic, newdata = rows, type = "response"))
suppressPackageStartupMessages(library(randomForest))
set.seed(3)
forest <- randomForest(k ~ a + b + c, data = d, ntree = 25)
save("r-rf", forest)
save("r-rf-prob", forest)
labels("r-rf", predict(forest, newdata = rows))
out("r-rf-prob", predict(forest, newdata = rows, type = "prob"))
writeLines(levels(d$k), file.path(root, "classes.txt"))
"""

# Settings beside each model.rds: glm answers probabilities, the forest's second copy too.
SETTINGS = {
    "r-lm": {},
    "r-glm": {"predict_type": "response"},
    "r-rf": {},
    "r-rf-prob": {"predict_type": "prob"},
}


@dataclass
class RModel:
    """A model of the repository: the rows to send and R's own answer for them."""

    rows: np.ndarray
    expected: np.ndarray


def run_r(source: str, root: Path) -> None:
    """Run R ``source`` with ``root`` (a folder) bound as ``root``."""
    program = f"root <- {json.dumps(str(root))}\n{source}"
    done = subprocess.run(["Rscript", "-e", program], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def build(root: Path) -> dict[str, RModel]:
    """The four model folders in ``root`` and their rows and answers."""
    run_r(TRAIN, root)
    rows = np.loadtxt(root / "rows.txt").reshape(-1, 3)
    models = {}
    for name, extra in SETTINGS.items():
        document = {"name": name, "implementation": "r", "parameters": {"extra": extra}}
        (root / name / "model-settings.json").write_text(json.dumps(document))
        if name == "r-rf":
            expected = np.array((root / "r-rf.txt").read_text().split(), dtype=object)
        else:
            expected = np.loadtxt(root / f"{name}.txt")
        if name == "r-rf-prob":
            expected = expected.reshape(len(rows), -1)
        # glm is fitted on a and b only: its rows have those two columns.
        models[name] = RModel(rows[:, :2] if name == "r-glm" else rows, expected)
    return models
