"""fpt from Python: the same engine as the `fpt` binary (Rust, on candle).

    import fpt
    result = fpt.train(spec, "runs/a")          # spec: a dict in spec.json's shape, or a path
    model = fpt.load("runs/a")
    probs = model.predict(x)                    # numpy in, class probabilities out
    fpt.compare(["runs/a"], vs=["runs/b"])      # the paired bootstrap, as a dict
    fpt.run_table("table1", scale="smoke", out="results")
    clf = fpt.FrozenTransformerClassifier(steps=300).fit(X, y)   # scikit-learn's API (fpt.sklearn)

Errors are raised as `fpt.FptError` with fpt's message (a malformed spec as `ValueError`).
Training and table runs release the GIL; Ctrl-C stops them with a checkpoint (KeyboardInterrupt);
training shows its progress as one updating line on sys.stderr, table runs as lines on stderr.
"""

import json
import os
from pathlib import Path

import numpy as np

from . import _native
from ._native import FptError

__all__ = ["train", "resume", "load", "compare", "run_table", "Model", "FptError", "FrozenTransformerClassifier"]


def _spec_json(spec):
    if isinstance(spec, (str, os.PathLike)):
        path = Path(spec)
        try:
            return path.read_text()
        except OSError as e:
            raise FptError(f"{path}: {e}") from None
    if isinstance(spec, dict):
        return json.dumps(spec)
    raise TypeError(f"spec must be a dict in spec.json's shape or a path to one, not {type(spec).__name__}")


def train(spec, out, device="cpu", progress=True, resume=False):
    """Train the run `spec` describes (a dict in the shape of a run's `spec.json`, or the
    path of such a file, e.g. one `fpt train` wrote) into the new directory `out`; returns
    its `result.json` as a dict (`test_accuracy`, `converged`, ...). `device`: "cpu" or
    "cuda:N" with a CUDA build. Progress, unless `progress=False`, is one line on
    `sys.stderr` that rewrites itself (step, loss, test accuracy, time left), as a notebook
    shows it.

    Ctrl-C (KeyboardInterrupt, also in a notebook) stops the run within a step, writes a
    checkpoint, and raises KeyboardInterrupt; `resume=True` (with the same spec) or
    `fpt.resume(out)` continues it to the result an unbroken run gives."""
    text = _native.train(_spec_json(spec), os.fspath(out), device, progress, resume)
    return json.loads(text)


def resume(out, device="cpu", progress=True):
    """Continue the run in `out` from its latest checkpoint (a run stopped by Ctrl-C, a
    deadline or a crash); returns its `result.json` as a dict."""
    text = _native.train(None, os.fspath(out), device, progress, True)
    return json.loads(text)


class Model:
    """A trained run, opened by `fpt.load`."""

    def __init__(self, native):
        self._native = native

    @property
    def input_kind(self):
        """"tokens" (predict takes int ids [examples, tokens]), "features" (float vectors
        [examples, tokens, width]) or "images" (uint8 images [examples, height, width] of
        the size the run trained on: MNIST, Fashion-MNIST)."""
        return self._native.input_kind

    @property
    def classes(self):
        """The number of classes."""
        return self._native.classes

    def predict(self, x):
        """Class probabilities, a float32 array [examples, classes], for `x`: token ids
        [examples, tokens], feature vectors [examples, tokens, width] as the run's task
        feeds its model (padded at the start, as the custom task pads), or uint8 images
        [examples, height, width]. Their argmax is the class evaluation scores."""
        if self.input_kind == "tokens":
            a = np.asarray(x)
            if a.dtype.kind == "f":
                # Ids are integers: a float that is not one is refused, never truncated.
                if not np.all(np.isfinite(a)) or not np.all(a == np.round(a)):
                    bad = np.argwhere(~np.isfinite(a) | (a != np.round(a)))[0]
                    raise ValueError(
                        f"token ids must be integers: x{list(map(int, bad))} is {a[tuple(bad)]!r}"
                    )
            elif a.dtype.kind not in "iub":
                raise ValueError(f"token ids must be integers, not {a.dtype}")
            a = np.ascontiguousarray(a, dtype=np.int64)
            return self._native.predict_tokens(a)
        if self.input_kind == "images":
            a = np.asarray(x)
            if a.dtype != np.uint8:
                raise ValueError(f"images must be uint8 pixels, not {a.dtype}")
            return self._native.predict_images(np.ascontiguousarray(a))
        a = np.ascontiguousarray(x, dtype=np.float32)
        return self._native.predict_features(a)

    def tensors(self):
        """The trained tensors (input and output layers, LayerNorms, positions, ...) by
        name, as float32 arrays."""
        return dict(self._native.tensors())


def load(run_dir, device="cpu"):
    """Open the run in `run_dir` (its latest checkpoint over the frozen backbone)."""
    return Model(_native.load(os.fspath(run_dir), device))


def compare(runs, vs, seed_sd=0.0):
    """Compare finished runs (one per seed) with others, paired in order: each accuracy,
    the mean difference in points with its 95% paired bootstrap interval over examples and
    seeds, and the verdict ("ahead", "behind", "within the uncertainty"). As `fpt compare
    --json`."""
    if isinstance(runs, (str, os.PathLike)):
        runs = [runs]
    if isinstance(vs, (str, os.PathLike)):
        vs = [vs]
    text = _native.compare([os.fspath(r) for r in runs], [os.fspath(v) for v in vs], float(seed_sd))
    return json.loads(text)


def run_table(ids, scale="cpu", out="results", tables=None, jobs=1, progress=True):
    """Run tables or figures of the paper (ids like "table1", or "all") at a scale ("smoke",
    "cpu", ...) into `out`, as `fpt run-table`; returns the report directories written.
    `tables`: the directory of table specs (default: `data/tables` of the checkout the
    package was built from, else of the working directory)."""
    if isinstance(ids, str):
        ids = [ids]
    if tables is None:
        tables = Path(_native.CHECKOUT_TABLES)
        if not tables.is_dir():
            tables = Path("data/tables")
    return _native.run_table(list(ids), scale, os.fspath(out), os.fspath(tables), int(jobs), progress)


# scikit-learn's estimator API over train and load (scikit-learn itself is optional).
from .sklearn import FrozenTransformerClassifier  # noqa: E402
