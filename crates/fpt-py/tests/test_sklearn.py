"""`fpt.FrozenTransformerClassifier` in scikit-learn's hands (issue 57): numpy arrays in,
string labels, inside a Pipeline in cross_val_score, GridSearchCV over lr, scikit-learn's
errors for bad input. Skipped where scikit-learn is not installed (CI installs it)."""

import json

import numpy as np
import pytest

import fpt

sklearn = pytest.importorskip("sklearn")
from sklearn.base import clone  # noqa: E402
from sklearn.exceptions import NotFittedError  # noqa: E402
from sklearn.model_selection import GridSearchCV, cross_val_score  # noqa: E402
from sklearn.pipeline import Pipeline  # noqa: E402
from sklearn.preprocessing import FunctionTransformer  # noqa: E402

TINY = dict(backbone="gpt2", init="random", layers=1, hidden=32, heads=2, steps=300, lr=3e-3,
            progress=False)


def data(n, salt):
    """3 vectors of width 2; "up" when the last vector's first number is positive."""
    rng = np.random.default_rng(salt)
    x = rng.uniform(-1, 1, size=(n, 3, 2)).astype(np.float32)
    y = np.where(x[:, 2, 0] > 0, "up", "down")
    return x, y


def test_fit_predict_score_with_string_labels(tmp_path):
    x, y = data(160, 1)
    xt, yt = data(80, 2)
    clf = fpt.FrozenTransformerClassifier(run_dir=tmp_path / "run", **TINY).fit(x, y)
    assert list(clf.classes_) == ["down", "up"]
    assert (tmp_path / "run" / "result.json").is_file() and clf.run_dir_ == str(tmp_path / "run")
    p = clf.predict_proba(xt)
    assert p.shape == (80, 2) and np.allclose(p.sum(axis=1), 1.0, atol=1e-5)
    pred = clf.predict(xt)
    assert set(pred) <= {"down", "up"}
    majority = max(np.mean(yt == "up"), np.mean(yt == "down"))
    assert clf.score(xt, yt) > majority + 0.1, (clf.score(xt, yt), majority)


def test_in_a_pipeline_in_cross_val_score_and_grid_search():
    x, y = data(150, 3)
    # Exactly the estimator (the default lr).
    pipe = Pipeline([("scale", FunctionTransformer(lambda a: a * 2.0)),
                     ("fpt", fpt.FrozenTransformerClassifier(backbone="gpt2", init="random", layers=1, hidden=32,
                                                             heads=2, steps=300, progress=False))])
    scores = cross_val_score(pipe, x, y, cv=3)
    majority = max(np.mean(y == "up"), np.mean(y == "down"))
    assert scores.mean() > majority, (scores, majority)
    grid = GridSearchCV(fpt.FrozenTransformerClassifier(**dict(TINY, steps=100)),
                        {"lr": [1e-3, 3e-3]}, cv=2)
    grid.fit(x, y)
    assert grid.best_params_["lr"] in (1e-3, 3e-3)
    assert len(grid.cv_results_["mean_test_score"]) == 2


def test_parameters_are_stored_as_given_and_clone_safely():
    clf = fpt.FrozenTransformerClassifier(**TINY)
    params = clf.get_params()
    assert params["layers"] == 1 and params["lr"] == 3e-3 and params["run_dir"] is None
    c = clone(clf).set_params(lr=1e-4)
    assert c.lr == 1e-4 and clf.lr == 3e-3
    assert not hasattr(c, "classes_")


def test_bad_input_gets_scikit_learns_errors():
    clf = fpt.FrozenTransformerClassifier(**TINY)
    x, y = data(20, 4)
    with pytest.raises(NotFittedError):
        clf.predict(x)
    with pytest.raises(ValueError, match="expected token ids"):
        clf.fit(x[:, :, :, None], y)
    with pytest.raises(ValueError, match="Unknown label type"):
        clf.fit(x, np.linspace(0, 1, 20))
    with pytest.raises(ValueError, match="20 examples but y has 19"):
        clf.fit(x, y[:19])
    with pytest.raises(ValueError, match="one class"):
        clf.fit(x, np.array(["a"] * 20))
    bad = x.copy()
    bad[0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        clf.fit(bad, y)


def test_scikit_learns_check_estimator_passes():
    """Every check of scikit-learn's `check_estimator` passes on a tiny frozen random
    transformer trained 1000 steps (the training check wants 83% on its blobs: at 300 steps
    this model does not get there). 2-D float input is a table, each column a token."""
    from sklearn.utils.estimator_checks import check_estimator

    clf = fpt.FrozenTransformerClassifier(**dict(TINY, hidden=16, steps=1000))
    try:
        results = check_estimator(clf, on_fail=None)
    except TypeError:  # scikit-learn before 1.6: no `on_fail`, raises on the first failure
        check_estimator(clf)
        return
    failed = [(r["check_name"], str(r["exception"])[:200]) for r in results if r["status"] == "failed"]
    assert not failed, failed
    assert len(results) >= 40


def test_every_keyword_reaches_the_runs_spec(tmp_path):
    """The keywords are `fpt train`'s options: they land in the run's spec.json as the CLI
    writes them."""
    x, y = data(120, 5)
    clf = fpt.FrozenTransformerClassifier(
        **dict(TINY, layers=2, steps=40), depth=1, no_final_norm=True, precision="bf16",
        micro_batch_size=8, clip=0.5, divergence_factor=50.0, orth_gain=1.0,
        input_init="uniform", no_backbone_dropout=True, lr_schedule="cosine:10", convergence_tolerance=0.02,
        early_stop_patience=4, stop_on_plateau=True, checkpoint_every=20, positions=16,
        residual_init="scaled", run_dir=tmp_path / "a").fit(x, y)
    spec = json.loads((tmp_path / "a" / "spec.json").read_text())
    b, t = spec["backbone"], spec["train"]
    assert (b["depth"], b["final_norm"], b["precision"], b["residual_init"]) == (1, False, "bf16", "scaled")
    assert b["shape"] == {"layers": 2, "hidden": 32, "heads": 2, "positions": 16}
    assert (t["micro_batch_size"], t["clip_norm"], t["divergence_factor"]) == (8, 0.5, 50.0)
    assert t["lr_schedule"] == {"kind": "cosine", "warmup_steps": 10}
    assert (t["early_stop_patience"], t["stop_on_plateau"], t["checkpoint_every"]) == (4, True, 20)
    assert (spec["orth_gain"], spec["backbone_dropout"]) == (1.0, False)
    assert spec["input_init"] == "uniform"
    assert clf.predict(x).shape == (120,)


def test_attention_only_blocks_reach_the_runs_spec(tmp_path):
    """`attention_only` (the critics' LLM2Attn shape) lands in spec.json's shape and the run
    trains; a backbone without such blocks is refused by name."""
    x, y = data(120, 5)
    clf = fpt.FrozenTransformerClassifier(
        backbone="sentence-transformers/all-MiniLM-L6-v2", init="random", layers=1, hidden=32,
        heads=2, attention_only=True, train=["input", "output", "layer_norm", "positions", "attention"],
        steps=40, progress=False, run_dir=tmp_path / "a").fit(x, y)
    spec = json.loads((tmp_path / "a" / "spec.json").read_text())
    assert spec["backbone"]["shape"] == {"layers": 1, "hidden": 32, "heads": 2, "attention_only": True}
    assert spec["train_groups"]["attention"] is True
    assert clf.predict(x).shape == (120,)
    with pytest.raises(Exception, match="attention-only"):
        fpt.FrozenTransformerClassifier(**dict(TINY, steps=10), attention_only=True,
                                        run_dir=tmp_path / "b").fit(x, y)
