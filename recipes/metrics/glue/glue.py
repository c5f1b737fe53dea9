"""GLUE metrics as a local ``evaluate`` module (works without the Hub).

Load it with ``evaluate.load(<folder holding this file>, config_name=task)``. The metric
per task is the official GLUE one (Wang et al., 2019):

* cola: Matthews correlation coefficient
* stsb: Pearson and Spearman correlation
* mrpc, qqp: F1 (positive class 1) and accuracy
* sst2, mnli, mnli_matched, mnli_mismatched, qnli, rte, wnli, hans, ax: accuracy

The output keys match the metric of the same name on the Hub.
"""

from __future__ import annotations

import datasets
import evaluate
import numpy as np
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import f1_score, matthews_corrcoef

_CITATION = """\
@inproceedings{wang2019glue,
  title={{GLUE}: A Multi-Task Benchmark and Analysis Platform for Natural Language Understanding},
  author={Wang, Alex and Singh, Amanpreet and Michael, Julian and Hill, Felix and Levy, Omer and Bowman, Samuel R.},
  booktitle={International Conference on Learning Representations},
  year={2019}
}
"""

_DESCRIPTION = "Official metric of each GLUE task, computed locally with scipy and scikit-learn."

_KWARGS_DESCRIPTION = """
Args:
    predictions: predicted labels (ints), or scores (floats) for stsb.
    references: gold labels (ints), or scores (floats) for stsb.
Returns:
    cola: {"matthews_correlation"}; stsb: {"pearson", "spearmanr"};
    mrpc, qqp: {"accuracy", "f1"}; every other task: {"accuracy"}.
Examples:
    >>> metric = evaluate.load("recipes/metrics/glue", "mrpc")
    >>> metric.compute(predictions=[0, 1, 1], references=[0, 1, 0])
    {'accuracy': 0.6666666666666666, 'f1': 0.6666666666666666}
"""

ACCURACY_TASKS = ("sst2", "mnli", "mnli_mismatched", "mnli_matched", "qnli", "rte", "wnli", "hans", "ax")
TASKS = ("cola", "stsb", "mrpc", "qqp") + ACCURACY_TASKS


def simple_accuracy(preds, labels) -> float:
    return float((np.asarray(preds) == np.asarray(labels)).mean())


def acc_and_f1(preds, labels) -> dict:
    return {"accuracy": simple_accuracy(preds, labels), "f1": float(f1_score(y_true=labels, y_pred=preds))}


def pearson_and_spearman(preds, labels) -> dict:
    preds, labels = np.asarray(preds, dtype=np.float64), np.asarray(labels, dtype=np.float64)
    return {
        "pearson": float(pearsonr(preds, labels)[0]),
        "spearmanr": float(spearmanr(preds, labels)[0]),
    }


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Glue(evaluate.Metric):
    def _info(self):
        if self.config_name not in TASKS:
            raise KeyError(
                f"Unknown GLUE metric config {self.config_name!r}; expected one of: {', '.join(TASKS)}"
            )
        dtype = "float32" if self.config_name == "stsb" else "int64"
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value(dtype), "references": datasets.Value(dtype)}),
            codebase_urls=[],
            reference_urls=["https://gluebenchmark.com/"],
            format="numpy",
        )

    def _compute(self, predictions, references):
        if self.config_name == "cola":
            return {"matthews_correlation": float(matthews_corrcoef(references, predictions))}
        if self.config_name == "stsb":
            return pearson_and_spearman(predictions, references)
        if self.config_name in ("mrpc", "qqp"):
            return acc_and_f1(predictions, references)
        return {"accuracy": simple_accuracy(predictions, references)}
