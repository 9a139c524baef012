"""The fpt Python package against the installed wheel (CI: `pip install ./crates/fpt-py`,
then `pytest crates/fpt-py/tests`). Needs the `fpt` binary for the spec it writes:
$FPT_BIN, else target/release/fpt of this checkout."""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import fpt

ROOT = Path(__file__).resolve().parents[3]
FPT_BIN = os.environ.get("FPT_BIN", str(ROOT / "target" / "release" / "fpt"))


def records(n, salt):
    """A small learnable task: 3 vectors of width 2; class 1 when the last vector's first
    number is positive."""
    rng = np.random.default_rng(salt)
    x = rng.uniform(-1, 1, size=(n, 3, 2)).astype(np.float32)
    y = (x[:, 2, 0] > 0).astype(int)
    return x, y


def write_jsonl(path, x, y):
    with open(path, "w") as f:
        for xi, yi in zip(x, y):
            f.write(json.dumps({"features": xi.tolist(), "label": int(yi)}) + "\n")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A spec written by `fpt train` (a 1-layer random GPT-2 on a custom JSONL task), then
    trained again from Python."""
    tmp = tmp_path_factory.mktemp("fpt")
    data = tmp / "data"
    data.mkdir()
    xtr, ytr = records(96, 1)
    xte, yte = records(48, 2)
    write_jsonl(data / "train.jsonl", xtr, ytr)
    write_jsonl(data / "test.jsonl", xte, yte)
    cli_run = tmp / "cli"
    subprocess.run(
        [FPT_BIN, "train", "--task", f"custom:{data}", "--backbone", "gpt2", "--init", "random",
         "--layers", "1", "--hidden", "16", "--heads", "2", "--steps", "300", "--lr", "3e-3",
         "-q", "--out", str(cli_run)],
        check=True,
    )
    spec = cli_run / "spec.json"
    out = tmp / "py"
    result = fpt.train(spec, out, progress=False)
    return {"tmp": tmp, "spec": spec, "out": out, "result": result, "cli": cli_run,
            "xte": xte, "yte": yte, "data": data}


def test_train_returns_the_result_and_matches_the_cli(trained):
    r = trained["result"]
    assert 0.0 <= r["test_accuracy"] <= 1.0
    on_disk = json.loads((trained["out"] / "result.json").read_text())
    assert on_disk["test_accuracy"] == r["test_accuracy"]
    # The same spec and seed on the same CPU: the same numbers as the binary's run.
    cli = json.loads((trained["cli"] / "result.json").read_text())
    assert cli["test_accuracy"] == r["test_accuracy"]
    # It learned: above the majority class of the test split.
    y = trained["yte"]
    assert r["test_accuracy"] > max(y.mean(), 1 - y.mean())


def test_predict_reproduces_the_test_accuracy(trained):
    model = fpt.load(trained["out"])
    assert model.input_kind == "features"
    assert model.classes == 2
    probs = model.predict(trained["xte"])
    assert probs.shape == (48, 2) and probs.dtype == np.float32
    assert np.allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    accuracy = float((probs.argmax(axis=1) == trained["yte"]).mean())
    assert accuracy == trained["result"]["test_accuracy"]
    # float64 and lists are converted.
    assert np.array_equal(model.predict(trained["xte"].astype(np.float64).tolist()), probs)


def test_tensors_are_the_trained_ones_by_name(trained):
    t = fpt.load(trained["out"]).tensors()
    assert t, "no trained tensors"
    assert all(isinstance(v, np.ndarray) and v.dtype == np.float32 for v in t.values())
    assert any("wpe" in k or "position" in k for k in t), sorted(t)


def test_compare_is_the_paired_bootstrap(trained):
    c = fpt.compare([trained["out"]], vs=[trained["cli"]])
    assert c["difference"] == 0.0
    lo, hi = c["interval"]
    assert lo <= 0.0 <= hi
    assert c["verdict"] == "within the uncertainty"
    assert c["runs"][0]["examples"] == 48


def test_errors_carry_fpts_messages(trained, tmp_path):
    model = fpt.load(trained["out"])
    with pytest.raises(fpt.FptError, match="width 2.*width 3|width 3.*width 2"):
        model.predict(np.zeros((2, 3, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="3-d"):
        model.predict(np.zeros((2, 3), dtype=np.float32))
    with pytest.raises(fpt.FptError, match="spec.json"):
        fpt.load(tmp_path / "nothing")
    with pytest.raises(ValueError, match="not a valid run spec"):
        fpt.train({"task": "nonsense"}, tmp_path / "bad", progress=False)
    with pytest.raises(fpt.FptError, match="outcomes"):
        fpt.compare([tmp_path], vs=[tmp_path])
    with pytest.raises(fpt.FptError, match="tablex"):
        fpt.run_table("tablex", scale="smoke", out=tmp_path / "results")
    # An existing run directory is not overwritten.
    with pytest.raises(fpt.FptError):
        fpt.train(trained["spec"], trained["out"], progress=False)


def test_a_generated_task_loads_but_predicts_on_nothing_from_outside(tmp_path):
    run = tmp_path / "xor"
    subprocess.run(
        [FPT_BIN, "train", "--task", "bit-xor", "--backbone", "gpt2", "--init", "random", "--layers", "1",
         "--hidden", "16", "--heads", "2", "--steps", "2", "-q", "--out", str(run)],
        check=True,
    )
    model = fpt.load(run)
    assert model.tensors(), "its trained tensors are readable"
    with pytest.raises(fpt.FptError, match="generates its examples"):
        model.predict(np.zeros((1, 10, 1), dtype=np.float32))


def test_training_releases_the_gil(trained, tmp_path):
    """While fpt.train runs in a thread, this thread keeps running Python: ticks land all
    through the middle of the training."""
    import threading
    import time

    times = {}
    done = threading.Event()

    def work():
        times["start"] = time.perf_counter()
        fpt.train(trained["spec"], tmp_path / "again", progress=False)
        times["end"] = time.perf_counter()
        done.set()

    t = threading.Thread(target=work)
    t.start()
    ticks = []
    while not done.is_set():
        ticks.append(time.perf_counter())
    t.join()
    span = times["end"] - times["start"]
    middle = [x for x in ticks if times["start"] + 0.25 * span < x < times["end"] - 0.25 * span]
    assert span > 0.05, f"training took {span:.3f} s: too short to tell"
    # A free Python loop ticks millions of times a second; 1000 in the middle half is a low
    # bar, and a call holding the GIL leaves 0 there (tried).
    assert len(middle) > 1000, f"{len(middle)} ticks in the middle half of {span:.2f} s of training"


def write_idx(path, array):
    """An IDX file of unsigned bytes (MNIST's format)."""
    a = np.ascontiguousarray(array, dtype=np.uint8)
    header = bytes([0, 0, 8, a.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in a.shape)
    path.write_bytes(header + a.tobytes())


def test_an_image_run_predicts_on_uint8_images(tmp_path):
    """A run of the mnist task (MNIST-format files: class 1 where the top half is bright)
    predicts on its test images as a uint8 array and gets `fpt eval`'s accuracy back."""
    rng = np.random.default_rng(3)

    def images(n):
        y = rng.integers(0, 2, n)
        x = rng.integers(0, 64, (n, 28, 28))
        x[y == 1, :14, :] += 160
        x[y == 0, 14:, :] += 160
        return x.astype(np.uint8), y.astype(np.uint8)

    data = tmp_path / "mnist"
    data.mkdir()
    xtr, ytr = images(64)
    xte, yte = images(40)
    write_idx(data / "train-images-idx3-ubyte", xtr)
    write_idx(data / "train-labels-idx1-ubyte", ytr)
    write_idx(data / "t10k-images-idx3-ubyte", xte)
    write_idx(data / "t10k-labels-idx1-ubyte", yte)
    run = tmp_path / "run"
    subprocess.run(
        [FPT_BIN, "train", "--task", "mnist", "--data-dir", str(data), "--backbone", "gpt2", "--init", "random",
         "--layers", "1", "--hidden", "16", "--heads", "2", "--steps", "60", "--lr", "3e-3", "-q",
         "--out", str(run)],
        check=True,
    )
    scored = json.loads(subprocess.run([FPT_BIN, "eval", str(run)], check=True, capture_output=True).stdout)
    model = fpt.load(run)
    assert model.input_kind == "images"
    probs = model.predict(xte)
    assert probs.shape == (40, 10)
    assert float((probs.argmax(axis=1) == yte).mean()) == scored["test_accuracy"]
    with pytest.raises(ValueError, match="uint8"):
        model.predict(xte.astype(np.float32))
    with pytest.raises(fpt.FptError, match="28x28"):
        model.predict(np.zeros((2, 20, 20), dtype=np.uint8))


def test_ctrl_c_stops_training_and_resume_gives_the_unbroken_result(trained, tmp_path):
    """SIGINT to a Python process inside fpt.train: it ends with KeyboardInterrupt,
    leaving a checkpoint and no result (so it stopped before its 30000 steps); fpt.resume
    then ends where an unbroken run of the same spec ends. The child sets Python's own
    SIGINT handler first: a shell that starts the suite in the background (`cmd &` without
    job control) leaves SIGINT ignored in every process under it, and Python then installs
    no KeyboardInterrupt at all (two local CI runs saw the whole run finish: 8.6 s, exit 0)."""
    import signal
    import sys
    import time

    spec = json.loads(Path(trained["spec"]).read_text())
    # Long enough that the run cannot end between its first evaluation and the signal on a
    # loaded machine (6000 steps of this 1-layer model took about a second, and a CI run
    # beside other work once finished them before the signal landed).
    spec["train"]["steps"] = 30000
    spec["train"]["eval_every"] = 200
    spec_path = tmp_path / "long.json"
    spec_path.write_text(json.dumps(spec))
    out = tmp_path / "interrupted"
    child = subprocess.Popen(
        [sys.executable, "-c",
         "import signal, sys, fpt; signal.signal(signal.SIGINT, signal.default_int_handler); "
         "fpt.train(sys.argv[1], sys.argv[2], progress=False)",
         str(spec_path), str(out)],
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text().strip()):
        assert child.poll() is None, f"the run ended before it could be interrupted: {child.stderr.read()}"
        assert time.monotonic() < deadline, "no evaluation within 120 s"
        time.sleep(0.01)
    child.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    _, err = child.communicate(timeout=30)
    took = time.monotonic() - t0
    assert took < 10, f"Ctrl-C took {took:.1f} s to stop the run"
    assert child.returncode != 0 and "KeyboardInterrupt" in err, err
    assert not (out / "result.json").exists(), "an interrupted run has no result"
    assert (out / "checkpoints" / "LATEST").exists(), "an interrupted run leaves a checkpoint"

    resumed = fpt.resume(out, progress=False)
    unbroken = fpt.train(spec_path, tmp_path / "unbroken", progress=False)
    for k in ["steps", "test_accuracy", "test_loss", "final_train_loss", "converged", "plateau"]:
        assert resumed[k] == unbroken[k], (k, resumed[k], unbroken[k])


def test_progress_is_one_updating_line_on_sys_stderr(trained, tmp_path, capsys):
    """Progress goes to Python's sys.stderr (what a notebook shows), as one line that
    rewrites itself: steps, loss, test accuracy and time left, then a single newline."""
    fpt.train(trained["spec"], tmp_path / "progress", progress=True)
    err = capsys.readouterr().err
    assert "\rfpt: step 300/300" in err, repr(err[-300:])
    assert "test_accuracy" in err and "left" in err, repr(err[-300:])
    assert err.count("\n") == 1 and err.endswith("\n"), repr(err[-300:])
    assert err.count("\r") >= 2, repr(err[-300:])


def test_the_librarys_warnings_reach_stderr_as_the_cli_prints_them(trained, tmp_path, capfd):
    # A class in the test split that training never shows: fpt warns, whatever the run learns.
    data = tmp_path / "data"
    data.mkdir()
    xtr, ytr = records(64, 3)
    xte, yte = records(32, 4)
    yte[:4] = 2
    write_jsonl(data / "train.jsonl", xtr, ytr)
    write_jsonl(data / "test.jsonl", xte, yte)
    spec = json.loads(Path(trained["spec"]).read_text())
    spec["task"]["path"] = str(data)
    spec["train"]["steps"] = 20
    capfd.readouterr()
    fpt.train(spec, tmp_path / "run", progress=False)
    err = capfd.readouterr().err
    assert "WARN" in err and "never in training" in err, err
