"""`FrozenTransformerClassifier`: fpt in scikit-learn's estimator API.

    from fpt import FrozenTransformerClassifier
    clf = FrozenTransformerClassifier(backbone="gpt2", init="random", layers=1, hidden=32,
                                      heads=2, steps=300)
    clf.fit(X, y).score(X_test, y_test)       # X: numpy arrays, y: any labels

`X` is token ids `[examples, tokens]` (integers), a table `[examples, features]` (floats:
each column one token of width 1), feature vectors `[examples, tokens, width]` (floats), or
uint8 images `[examples, height, width]` (each image row one token of `width` pixels scaled
to 0..1). `fit` writes the data as fpt's custom JSON Lines task
(`docs/usage.md`, "Tasks and data"; the file is named by its content, beside `run_dir`),
holds out `validation_fraction` of it as the split fpt evaluates on (the same examples for
every seed, so that `fpt.compare` pairs runs of several seeds), trains a run with `fpt.train` into `run_dir` (a temporary directory unless
given; kept and named by `run_dir_`) and opens it with `fpt.load`. Every keyword is the
`fpt train` option of the same name; `__init__` stores them as given (scikit-learn's
`clone`, `Pipeline`, `cross_val_score` and `GridSearchCV` rely on it). Progress and Ctrl-C
are `fpt.train`'s: one updating line on stderr; a stop with a checkpoint and
KeyboardInterrupt.
"""

import hashlib
import json
import os
import tempfile
from pathlib import Path

import numpy as np

try:  # scikit-learn's base classes where it is installed (it is not a requirement of fpt)
    from sklearn.base import BaseEstimator, ClassifierMixin
    from sklearn.exceptions import NotFittedError
except ImportError:  # pragma: no cover - exercised only without scikit-learn
    class NotFittedError(ValueError, AttributeError):
        """The estimator was used before `fit`."""

    class BaseEstimator:
        """The part of scikit-learn's BaseEstimator fpt needs: parameters by name."""

        def get_params(self, deep=True):
            return {k: getattr(self, k) for k in _PARAMS}

        def set_params(self, **params):
            for k, v in params.items():
                if k not in _PARAMS:
                    raise ValueError(f"invalid parameter {k!r} for FrozenTransformerClassifier")
                setattr(self, k, v)
            return self

    class ClassifierMixin:
        """Accuracy as the score, as scikit-learn's ClassifierMixin."""

        def score(self, X, y, sample_weight=None):
            pred = self.predict(X)
            return float(np.average(pred == np.asarray(y), weights=sample_weight))

from . import load, train

try:
    from sklearn.utils import check_array as _check_array
    from sklearn.utils.multiclass import type_of_target as _type_of_target
except ImportError:  # pragma: no cover
    _check_array = None
    _type_of_target = None

_PARAMS = [
    "backbone", "init", "layers", "hidden", "heads", "positions", "attention_only", "residual_init", "depth",
    "no_final_norm", "precision", "train", "steps", "batch_size", "micro_batch_size",
    "lr", "clip", "divergence_factor", "input_dropout", "orth_gain", "input_init", "no_backbone_dropout",
    "seed", "lr_schedule", "eval_every", "convergence_tolerance", "early_stop_patience",
    "early_stop_within_noise", "stop_on_plateau", "checkpoint_every", "device",
    "validation_fraction", "run_dir", "progress",
]


class FrozenTransformerClassifier(ClassifierMixin, BaseEstimator):
    """A frozen transformer with trained input and output layers (FPT), as a scikit-learn
    classifier. See the module's docs for `X`; `y` may hold any hashable labels (strings
    too): `classes_` keeps them as given, sorted, and `predict` returns them.

    Parameters: each `fpt train` option that applies to arrays, by the same name
    (docs/usage.md): `backbone` ("gpt2", a Hub id or a directory), `init`, `layers` /
    `hidden` / `heads` / `positions` (a random-init backbone's shape), `attention_only`
    (random-init BERT-family blocks without their feed-forward half), `residual_init`,
    `depth`, `no_final_norm`, `precision` ("f32" or "bf16"), `train` (the trained groups: "fpt", "all", "out", or a list of groups), `steps`,
    `batch_size`, `micro_batch_size`, `lr`, `clip`, `divergence_factor`, `input_dropout`,
    `orth_gain`, `input_init` ("orthogonal" or "uniform"), `no_backbone_dropout`, `seed`, `lr_schedule` ("constant", "linear:W",
    "cosine:W"), `eval_every` (default: 4 evaluations a run), `convergence_tolerance`,
    `early_stop_patience`, `early_stop_within_noise`, `stop_on_plateau`, `checkpoint_every`,
    `device` ("cpu" or "cuda:N"). Not here: `--model` (the linear and output-only runs
    cannot be opened for predictions: scikit-learn's own LogisticRegression is the linear
    floor beside it, as the notebook does), the task options (`X` is the data), `--seeds`
    (one estimator, one seed) and `--resume`. And the estimator's own: `validation_fraction` (held out for fpt's evaluations and `validation_score_`),
    `run_dir` (where the run is kept; default a new temporary directory) and `progress`."""

    def __init__(self, backbone="gpt2", init="pretrained", layers=None, hidden=None, heads=None,
                 positions=None, attention_only=False, residual_init="unscaled", depth=None, no_final_norm=False,
                 precision="f32", train="fpt", steps=1000, batch_size=16,
                 micro_batch_size=None, lr=1e-3, clip=1.0, divergence_factor=None,
                 input_dropout=0.1, orth_gain=1.41, input_init="orthogonal", no_backbone_dropout=False, seed=0,
                 lr_schedule="constant", eval_every=None, convergence_tolerance=0.01,
                 early_stop_patience=None, early_stop_within_noise=False, stop_on_plateau=False,
                 checkpoint_every=None, device="cpu", validation_fraction=0.1, run_dir=None,
                 progress=True):
        self.backbone = backbone
        self.init = init
        self.layers = layers
        self.hidden = hidden
        self.heads = heads
        self.positions = positions
        self.attention_only = attention_only
        self.residual_init = residual_init
        self.depth = depth
        self.no_final_norm = no_final_norm
        self.precision = precision
        self.train = train
        self.steps = steps
        self.batch_size = batch_size
        self.micro_batch_size = micro_batch_size
        self.lr = lr
        self.clip = clip
        self.divergence_factor = divergence_factor
        self.input_dropout = input_dropout
        self.orth_gain = orth_gain
        self.input_init = input_init
        self.no_backbone_dropout = no_backbone_dropout
        self.seed = seed
        self.lr_schedule = lr_schedule
        self.eval_every = eval_every
        self.convergence_tolerance = convergence_tolerance
        self.early_stop_patience = early_stop_patience
        self.early_stop_within_noise = early_stop_within_noise
        self.stop_on_plateau = stop_on_plateau
        self.checkpoint_every = checkpoint_every
        self.device = device
        self.validation_fraction = validation_fraction
        self.run_dir = run_dir
        self.progress = progress

    # --- the data -------------------------------------------------------------------------

    @staticmethod
    def _inputs(X):
        """`X` as fpt reads it: ("tokens", int array) or ("features", float32 array), with
        scikit-learn's ValueError naming what is wrong. 2-D floats are a table: each column
        one token of width 1 (as Bit XOR feeds one bit a token)."""
        if _check_array is not None:
            # scikit-learn's own checks and messages: sparse, complex, object, empty, NaN/inf.
            X = _check_array(X, allow_nd=True, dtype=None, ensure_min_features=1, ensure_min_samples=1)
        a = np.asarray(X)
        if a.dtype == object:
            try:
                a = a.astype(np.float64)
            except TypeError as e:
                raise TypeError(f"X must hold numbers: {e}") from None
            except ValueError as e:
                raise ValueError(f"X must hold numbers: {e}") from None
        if a.ndim == 2 and a.dtype.kind in "iub" and a.dtype != np.uint8:
            if a.size and a.min() < 0:
                raise ValueError(f"token ids must be non-negative: X holds {int(a.min())}")
            return "tokens", a.astype(np.int64)
        if a.ndim == 3 and a.dtype == np.uint8:
            return "features", a.astype(np.float32) / 255.0
        if a.ndim in (2, 3) and a.dtype.kind in "fiu":
            f = a.astype(np.float32)
            if not np.all(np.isfinite(f)):
                raise ValueError("Input X contains NaN or infinity (or a value too large for float32)")
            return "features", f[:, :, None] if f.ndim == 2 else f
        raise ValueError(
            f"X of shape {a.shape} and dtype {a.dtype}: expected token ids [examples, tokens] (integers), "
            "a table [examples, features] (floats), feature vectors [examples, tokens, width] "
            "or uint8 images [examples, height, width]"
        )

    @staticmethod
    def _records(kind, a, labels, split):
        key = "tokens" if kind == "tokens" else "features"
        for row, label in zip(a, labels):
            yield json.dumps({key: row.tolist(), "label": int(label), "split": split})

    def _spec(self, data_path, n_train):
        steps = int(self.steps)
        train_groups = {
            "fpt": {"input": True, "output": True, "layer_norm": True, "positions": True,
                    "attention": False, "feed_forward": False},
            "all": {g: True for g in ["input", "output", "layer_norm", "positions", "attention", "feed_forward"]},
            "out": {"input": False, "output": True, "layer_norm": False, "positions": False,
                    "attention": False, "feed_forward": False},
        }
        if isinstance(self.train, str):
            if self.train not in train_groups:
                raise ValueError(f"train={self.train!r}: expected 'fpt', 'all', 'out' or a list of groups")
            groups = train_groups[self.train]
        else:
            groups = {g: g in set(self.train) for g in train_groups["all"]}
        shape = {k: int(v) for k, v in [("layers", self.layers), ("hidden", self.hidden), ("heads", self.heads),
                                         ("positions", self.positions)] if v is not None}
        if self.attention_only:
            shape["attention_only"] = True
        batch = int(self.batch_size)
        backbone = {"source": self.backbone, "init": self.init, "shape": shape}
        if self.residual_init != "unscaled":
            backbone["residual_init"] = self.residual_init
        if self.depth is not None:
            backbone["depth"] = int(self.depth)
        if self.no_final_norm:
            backbone["final_norm"] = False
        if self.precision != "f32":
            backbone["precision"] = self.precision
        kind, _, warmup = str(self.lr_schedule).partition(":")
        schedule = {"kind": kind} if kind == "constant" else {"kind": kind, "warmup_steps": int(warmup or 0)}
        train_spec = {
            "steps": steps, "batch_size": batch,
            "micro_batch_size": int(self.micro_batch_size) if self.micro_batch_size else batch,
            "lr": float(self.lr), "clip_norm": float(self.clip) if self.clip else None,
            "eval_every": int(self.eval_every) if self.eval_every else max(1, steps // 4),
            "seed": int(self.seed), "lr_schedule": schedule, "train_eval": "never",
            "checkpoint_every": int(self.checkpoint_every) if self.checkpoint_every else None,
            "convergence_tolerance": float(self.convergence_tolerance),
            "early_stop_patience": int(self.early_stop_patience) if self.early_stop_patience else None,
        }
        if self.early_stop_within_noise:
            train_spec["early_stop_within_noise"] = True
        if self.stop_on_plateau:
            train_spec["stop_on_plateau"] = True
        if self.divergence_factor is not None:
            train_spec["divergence_factor"] = float(self.divergence_factor)
        spec = {
            "task": {"name": "custom", "eval_examples": 0, "path": str(data_path)},
            "backbone": backbone,
            "train_groups": groups,
            "train": train_spec,
            "input_dropout": float(self.input_dropout),
            "orth_gain": float(self.orth_gain),
            "backbone_dropout": not self.no_backbone_dropout,
        }
        if self.input_init not in ("orthogonal", "uniform"):
            raise ValueError(f"input_init={self.input_init!r}: expected 'orthogonal' or 'uniform'")
        if self.input_init != "orthogonal":
            spec["input_init"] = self.input_init
        return spec

    # --- the estimator --------------------------------------------------------------------

    def fit(self, X, y):
        """Train a run on `X`, `y` (see the class docs); returns self."""
        if y is None:
            raise ValueError("requires y to be passed, but the target y is None")
        kind, a = self._inputs(X)
        y = np.asarray(y)
        if y.ndim == 2 and y.shape[1] == 1:
            import warnings

            try:
                from sklearn.exceptions import DataConversionWarning as _Warn
            except ImportError:  # pragma: no cover
                _Warn = UserWarning
            warnings.warn(
                "A column-vector y was passed when a 1d array was expected; it was raveled to 1-D",
                _Warn,
                stacklevel=2,
            )
            y = y.ravel()
        if _type_of_target is not None and _type_of_target(y) not in ("binary", "multiclass"):
            raise ValueError(f"Unknown label type: {_type_of_target(y)} (a classifier takes class labels)")
        if y.ndim != 1:
            raise ValueError(f"y must be 1-D (one label per example), not of shape {y.shape}")
        if len(y) != len(a):
            raise ValueError(f"X has {len(a)} examples but y has {len(y)} labels")
        self.classes_, encoded = np.unique(y, return_inverse=True)
        if len(self.classes_) < 2:
            raise ValueError(f"y holds one class ({self.classes_[0]!r}): a classifier needs at least 2")
        # The held-out split does not depend on `seed`: runs of several seeds on the same data
        # evaluate the same examples, so `fpt.compare` pairs them.
        order = np.random.default_rng(0).permutation(len(a))
        n_val = max(1, int(round(float(self.validation_fraction) * len(a))))
        if n_val >= len(a):
            raise ValueError(f"validation_fraction={self.validation_fraction} leaves no examples to train on")
        val, tr = order[:n_val], order[n_val:]
        run_dir = Path(self.run_dir) if self.run_dir is not None else Path(tempfile.mkdtemp(prefix="fpt-sklearn-")) / "run"
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        lines = list(self._records(kind, a[tr], encoded[tr], "train"))
        lines += list(self._records(kind, a[val], encoded[val], "test"))
        text = "".join(line + "\n" for line in lines)
        # Named by its content: fits on the same data beside each other share one file, so
        # their runs are runs of one task (`fpt.compare` refuses runs of different tasks).
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        data = run_dir.parent / f"fpt-data-{digest}.jsonl"
        if not data.is_file():
            tmp = data.with_name(data.name + f".{os.getpid()}.part")
            tmp.write_text(text)
            os.replace(tmp, data)
        self.result_ = train(self._spec(data, len(tr)), run_dir, device=self.device, progress=self.progress)
        self.run_dir_ = os.fspath(run_dir)
        self.validation_score_ = self.result_["test_accuracy"]
        self.n_features_in_ = a.shape[1]
        self._model = load(run_dir, device=self.device)
        self._kind = kind
        return self

    def __getstate__(self):
        # The opened model is native (not picklable): a pickle keeps the run's directory,
        # and unpickling opens it again.
        state = self.__dict__.copy()
        state.pop("_model", None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        if "run_dir_" in state:
            self._model = load(state["run_dir_"], device=state.get("device", "cpu"))

    def _check_fitted(self):
        if not hasattr(self, "_model"):
            raise NotFittedError(
                "this FrozenTransformerClassifier is not fitted yet: call fit(X, y) before predicting"
            )

    def predict_proba(self, X):
        """Class probabilities `[examples, classes]`, columns in `classes_`' order."""
        self._check_fitted()
        kind, a = self._inputs(X)
        if kind != self._kind:
            raise ValueError(f"X is {kind}, but the model was fitted on {self._kind}")
        if a.shape[1] != self.n_features_in_:
            raise ValueError(
                f"X has {a.shape[1]} features, but FrozenTransformerClassifier is expecting "
                f"{self.n_features_in_} features as input"
            )
        p = self._model.predict(a)
        return np.asarray(p)[:, : len(self.classes_)]

    def predict(self, X):
        """The most probable class of each example, as a label of `classes_`."""
        self._check_fitted()
        return self.classes_[np.argmax(self.predict_proba(X), axis=1)]
