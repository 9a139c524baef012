//! The native half of the `fpt` Python package (`fpt._native`); `python/fpt/__init__.py`
//! is the API users call, with its docs. Everything here calls the same library functions
//! as the `fpt` binary: `fpt_train::train`, `fpt_train::Predictor`,
//! `fpt_ablate::compare::compare_runs` and `fpt_ablate::reproduce::reproduce`. Errors come
//! back as `fpt.FptError` carrying fpt's message (a bad spec as `ValueError`); training and
//! table runs release the GIL.

use numpy::{IntoPyArray, PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use std::path::PathBuf;

pyo3::create_exception!(
    fpt,
    FptError,
    PyException,
    "An fpt run, load, prediction or comparison failed; the message is fpt's."
);

/// An error and its causes, on one line, as the `fpt` binary prints them.
fn fpt_err(e: &dyn std::error::Error) -> PyErr {
    let mut msg = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let t = c.to_string();
        if !msg.contains(&t) {
            msg.push_str(": ");
            msg.push_str(&t);
        }
        cause = c.source();
    }
    FptError::new_err(msg)
}

fn device(name: &str) -> PyResult<candle_core::Device> {
    fpt_nn::device::parse(name).map_err(|e| fpt_err(&e))
}

/// Reads a run spec from JSON text (a run's `spec.json` format) and validates it.
fn spec_of(json: &str) -> PyResult<fpt_spec::RunSpec> {
    let spec: fpt_spec::RunSpec =
        serde_json::from_str(json).map_err(|e| PyValueError::new_err(format!("not a valid run spec: {e}")))?;
    spec.validate().map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(spec)
}

/// Runs `f` (training, which releases the GIL) on another thread while this one waits with
/// the GIL free, checking for signals every 50 ms: Ctrl-C (SIGINT, KeyboardInterrupt) asks
/// the run to stop at its next step with a checkpoint ([`fpt_train::stop`]), waits for it,
/// and raises KeyboardInterrupt; the run resumes later (`fpt.resume`). Progress text the run
/// sends on `progress` is written to Python's `sys.stderr` (what a notebook shows) from this
/// thread.
fn interruptible<T: Send>(
    py: Python<'_>,
    progress: Option<std::sync::mpsc::Receiver<String>>,
    f: impl FnOnce() -> PyResult<T> + Send,
) -> PyResult<T> {
    let show = |py: Python<'_>| {
        if let Some(rx) = &progress {
            let text: String = rx.try_iter().collect();
            if !text.is_empty() {
                if let Ok(err) = py.import("sys").and_then(|sys| sys.getattr("stderr")) {
                    let _ = err.call_method1("write", (text,));
                    let _ = err.call_method0("flush");
                }
            }
        }
    };
    let out = std::thread::scope(|s| {
        let handle = s.spawn(f);
        loop {
            show(py);
            if handle.is_finished() {
                return handle
                    .join()
                    .unwrap_or_else(|_| Err(FptError::new_err("the run panicked (its message is above)")));
            }
            if let Err(interrupt) = py.check_signals() {
                fpt_train::stop::request();
                let _ = py.allow_threads(|| handle.join());
                fpt_train::stop::clear_request();
                return Err(interrupt);
            }
            py.allow_threads(|| std::thread::sleep(std::time::Duration::from_millis(50)));
        }
    });
    show(py);
    out
}

/// The run's progress as one line that rewrites itself (`\r`): step, loss, the last test
/// accuracy and the time left at the pace so far; at most five updates a second, and a
/// newline when the run ends.
struct ProgressLine {
    tx: std::sync::mpsc::Sender<String>,
    start: std::time::Instant,
    last_sent: Option<std::time::Instant>,
    from_step: usize,
    steps: usize,
    accuracy: Option<f64>,
}

impl ProgressLine {
    fn new(tx: std::sync::mpsc::Sender<String>) -> Self {
        ProgressLine {
            tx,
            start: std::time::Instant::now(),
            last_sent: None,
            from_step: 0,
            steps: 0,
            accuracy: None,
        }
    }

    fn line(&self, step: usize, loss: f64) -> String {
        let done = step.saturating_sub(self.from_step);
        let secs = self.start.elapsed().as_secs_f64();
        let left = if done > 0 {
            let s = (self.steps.saturating_sub(step)) as f64 * secs / done as f64;
            format!("{}:{:02} left", (s / 60.0) as u64, (s % 60.0) as u64)
        } else {
            "time left: -".into()
        };
        let acc = self
            .accuracy
            .map_or(String::new(), |a| format!("  test_accuracy {a:.4}"));
        format!("\rfpt: step {step}/{}  loss {loss:.4}{acc}  {left}   ", self.steps)
    }

    fn on(&mut self, e: &fpt_train::Event) {
        match e {
            fpt_train::Event::Started { from_step, steps, .. } => {
                self.from_step = *from_step;
                self.steps = *steps;
                self.start = std::time::Instant::now();
            }
            fpt_train::Event::Step { step, loss } => {
                let due = self.last_sent.is_none_or(|t| t.elapsed().as_secs_f64() >= 0.2) || *step == self.steps;
                if due {
                    self.last_sent = Some(std::time::Instant::now());
                    let _ = self.tx.send(self.line(*step, *loss));
                }
            }
            fpt_train::Event::Eval(r) => {
                self.accuracy = Some(r.test_accuracy);
                let _ = self.tx.send(self.line(r.step, r.train_loss));
            }
            fpt_train::Event::Diverged(s) => {
                let _ = self.tx.send(format!("\nfpt: diverged at step {s}\n"));
            }
            _ => {}
        }
    }
}

impl Drop for ProgressLine {
    fn drop(&mut self) {
        let _ = self.tx.send("\n".into());
    }
}

/// Trains the run `spec_json` describes into `out` (or, with `resume`, continues the run in
/// `out` from its latest checkpoint); returns its `result.json` text. Ctrl-C stops it with a
/// checkpoint and raises KeyboardInterrupt.
#[pyfunction]
#[pyo3(signature = (spec_json, out, device_name = "cpu", progress = true, resume = false))]
fn train(
    py: Python<'_>,
    spec_json: Option<&str>,
    out: PathBuf,
    device_name: &str,
    progress: bool,
    resume: bool,
) -> PyResult<String> {
    let spec = spec_json.map(spec_of).transpose()?;
    let dev = device(device_name)?;
    let out_dir = out.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    interruptible(py, progress.then_some(rx), move || {
        let mut line = progress.then(|| ProgressLine::new(tx));
        let mut on_event = |e: &fpt_train::Event| {
            if let Some(l) = line.as_mut() {
                l.on(e);
            }
        };
        match (resume, &spec) {
            (true, _) => fpt_train::resume(&out_dir, spec.as_ref(), &dev, &mut on_event),
            (false, Some(spec)) => fpt_train::train(spec, &out_dir, &dev, &mut on_event),
            (false, None) => {
                return Err(PyValueError::new_err(
                    "a spec is needed to start a run (resume=True continues one)",
                ))
            }
        }
        .map_err(|e| fpt_err(&e))
    })?;
    let path = out.join("result.json");
    std::fs::read_to_string(&path).map_err(|e| FptError::new_err(format!("{}: {e}", path.display())))
}

/// A trained run opened for predictions (`fpt.load`).
#[pyclass(unsendable)]
struct Model {
    inner: fpt_train::Predictor,
}

#[pymethods]
impl Model {
    /// Class probabilities `[n, classes]` (float32) for token ids `[n, tokens]` (int64) or
    /// feature vectors `[n, tokens, width]` (float32).
    fn predict_tokens<'py>(
        &self,
        py: Python<'py>,
        x: PyReadonlyArrayDyn<'py, i64>,
    ) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        let shape = x.shape().to_vec();
        if shape.len() != 2 {
            return Err(PyValueError::new_err(format!(
                "token ids must be a 2-d array [examples, tokens], not of shape {shape:?}"
            )));
        }
        let flat = x.as_slice().map_err(|e| PyValueError::new_err(e.to_string()))?;
        let mut seqs = Vec::with_capacity(shape[0]);
        for (i, row) in flat.chunks(shape[1].max(1)).take(shape[0]).enumerate() {
            let ids = row
                .iter()
                .map(|&v| {
                    u32::try_from(v).map_err(|_| {
                        PyValueError::new_err(format!("example {i}: token id {v} is negative or too large"))
                    })
                })
                .collect::<PyResult<Vec<u32>>>()?;
            seqs.push(ids);
        }
        let n = seqs.len();
        let data = fpt_tasks::Dataset {
            lengths: vec![shape[1] as u32; n],
            labels: vec![0; n],
            examples: fpt_tasks::Examples::Tokens(seqs),
        };
        self.run(py, &data)
    }

    /// As `predict_tokens`, for feature vectors `[n, tokens, width]` (float32).
    fn predict_features<'py>(
        &self,
        py: Python<'py>,
        x: PyReadonlyArrayDyn<'py, f32>,
    ) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        let shape = x.shape().to_vec();
        if shape.len() != 3 {
            return Err(PyValueError::new_err(format!(
                "features must be a 3-d array [examples, tokens, width], not of shape {shape:?}"
            )));
        }
        let flat = x.as_slice().map_err(|e| PyValueError::new_err(e.to_string()))?;
        if let Some(i) = flat.iter().position(|v| !v.is_finite()) {
            return Err(PyValueError::new_err(format!(
                "features: value {i} (flat) is not finite"
            )));
        }
        let per = shape[1] * shape[2];
        let seqs: Vec<Vec<f32>> = (0..shape[0]).map(|i| flat[i * per..(i + 1) * per].to_vec()).collect();
        let n = seqs.len();
        let data = fpt_tasks::Dataset {
            lengths: vec![shape[1] as u32; n],
            labels: vec![0; n],
            examples: fpt_tasks::Examples::Features { width: shape[2], seqs },
        };
        self.run(py, &data)
    }

    /// As `predict_tokens`, for images `[n, height, width]` (uint8, one channel) of the size
    /// the run trained on (MNIST, Fashion-MNIST).
    fn predict_images<'py>(
        &self,
        py: Python<'py>,
        x: PyReadonlyArrayDyn<'py, u8>,
    ) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        let shape = x.shape().to_vec();
        if shape.len() != 3 {
            return Err(PyValueError::new_err(format!(
                "images must be a 3-d uint8 array [examples, height, width], not of shape {shape:?}"
            )));
        }
        let pixels = x.as_slice().map_err(|e| PyValueError::new_err(e.to_string()))?.to_vec();
        let data = fpt_tasks::Dataset {
            lengths: Vec::new(),
            labels: vec![0; shape[0]],
            examples: fpt_tasks::Examples::Images {
                height: shape[1],
                width: shape[2],
                channels: 1,
                pixels,
            },
        };
        self.run(py, &data)
    }

    /// `"tokens"`, `"features"` or `"images"`: what `predict` takes for this run.
    #[getter]
    fn input_kind(&self) -> &'static str {
        if self.inner.image_size().is_some() {
            return "images";
        }
        match self.inner.dims().input {
            fpt_tasks::InputKind::Tokens { .. } => "tokens",
            fpt_tasks::InputKind::Vectors { .. } => "features",
        }
    }

    /// The number of classes.
    #[getter]
    fn classes(&self) -> usize {
        self.inner.dims().classes
    }

    /// The checkpoint's trained tensors by name, as float32 arrays.
    fn tensors<'py>(&self, py: Python<'py>) -> PyResult<Vec<(String, Bound<'py, PyArrayDyn<f32>>)>> {
        let mut names: Vec<&String> = self.inner.trained().keys().collect();
        names.sort();
        names
            .into_iter()
            .map(|name| {
                let t = &self.inner.trained()[name];
                let dims = t.dims().to_vec();
                let v = t
                    .to_dtype(candle_core::DType::F32)
                    .and_then(|t| fpt_nn::transfer::download_vec::<f32>(&t))
                    .map_err(|e| fpt_err(&e))?;
                let a = v.into_pyarray(py).reshape(dims)?;
                Ok((name.clone(), a))
            })
            .collect()
    }
}

impl Model {
    fn run<'py>(&self, py: Python<'py>, data: &fpt_tasks::Dataset) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        let p = self.inner.predict(data).map_err(|e| fpt_err(&e))?;
        let k = self.inner.dims().classes;
        let flat: Vec<f32> = p.probabilities.into_iter().flatten().collect();
        let n = flat.len() / k.max(1);
        flat.into_pyarray(py).reshape(vec![n, k])
    }
}

/// Opens the run in `run_dir` (its latest checkpoint) for predictions.
#[pyfunction]
#[pyo3(signature = (run_dir, device_name = "cpu"))]
fn load(run_dir: PathBuf, device_name: &str) -> PyResult<Model> {
    let dev = device(device_name)?;
    let inner = fpt_train::Predictor::open(&run_dir, &dev).map_err(|e| fpt_err(&e))?;
    Ok(Model { inner })
}

/// The paired comparison of `runs` with `vs`, as JSON text.
#[pyfunction]
#[pyo3(signature = (runs, vs, seed_sd = 0.0))]
fn compare(runs: Vec<PathBuf>, vs: Vec<PathBuf>, seed_sd: f64) -> PyResult<String> {
    let c = fpt_ablate::compare::compare_runs(&runs, &vs, seed_sd).map_err(|e| fpt_err(&e))?;
    serde_json::to_string(&c).map_err(|e| FptError::new_err(e.to_string()))
}

/// Runs tables of the paper at a scale (as `fpt run-table`): the report directories made.
#[pyfunction]
#[pyo3(signature = (ids, scale, out, tables, jobs = 1, progress = true))]
fn run_table(
    py: Python<'_>,
    ids: Vec<String>,
    scale: String,
    out: PathBuf,
    tables: PathBuf,
    jobs: usize,
    progress: bool,
) -> PyResult<Vec<String>> {
    let req = fpt_ablate::reproduce::Request {
        tables,
        ids,
        scale,
        out,
        opts: fpt_ablate::RunOptions {
            jobs: jobs.max(1),
            ..Default::default()
        },
        precision: fpt_spec::Precision::F32,
    };
    let done = interruptible(py, None, move || {
        let mut on = |p: fpt_ablate::reproduce::Progress| {
            if let (true, fpt_ablate::reproduce::Progress::Line { id, line }) = (progress, p) {
                eprintln!("fpt {id}: {line}");
            }
        };
        fpt_ablate::reproduce::reproduce(&req, &mut on).map_err(|e| fpt_err(&e))
    })?;
    Ok(done
        .iter()
        .map(|d| match d {
            fpt_ablate::reproduce::Done::Table { dir, .. } => dir.display().to_string(),
            fpt_ablate::reproduce::Done::Figure { dir, .. } => dir.display().to_string(),
        })
        .collect())
}

/// The module `fpt._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    fpt_nn::quiet_candle_pool();
    // The library's warnings (and FPT_LOG's choice) on stderr, as the `fpt` binary prints
    // them; a host process that installed a subscriber first keeps it.
    fpt_train::log_to_stderr();
    m.add("FptError", m.py().get_type::<FptError>())?;
    m.add(
        "CHECKOUT_TABLES",
        concat!(env!("CARGO_MANIFEST_DIR"), "/../../data/tables"),
    )?;
    m.add_function(wrap_pyfunction!(train, m)?)?;
    m.add_function(wrap_pyfunction!(load, m)?)?;
    m.add_function(wrap_pyfunction!(compare, m)?)?;
    m.add_function(wrap_pyfunction!(run_table, m)?)?;
    m.add_class::<Model>()?;
    Ok(())
}
