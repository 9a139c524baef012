//! Output-only training on cached features (paper §3.9, Table 10: reservoir computing).
//!
//! The input layer keeps its fixed random init (orthogonal for vector inputs, N(0, 1) for
//! token embeddings), and everything but the output layer is frozen, so the backbone's
//! read-out features of each training example never change: they are computed once (one
//! forward pass over the training set, no dropout), and the output layer is then trained on
//! the cache for `cached_epochs` epochs (Adam, the run's learning rate, batch size and
//! clipping; a fresh shuffle each epoch). The held-out features are cached the same way.
//!
//! The training set: the dataset's training split (or its `train_examples` sample); for a
//! generated task, `steps x batch_size` examples drawn once.
//!
//! Speedup, as the paper defines it (wall-clock time per epoch after the first): the time of
//! an FPT epoch over the same examples (measured: FPT training steps of the same model
//! shape, batch and task, timed after a warm-up step, times the steps in an epoch) over the
//! median time of a cached epoch after the first.

use crate::{metrics_append, optim, EvalRecord, Event, Result, RunResult, Trainer};
use candle_core::{DType, Device, Tensor};
use fpt_nn::{ops, Ctx, Rng};
use fpt_tasks::Split;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::Instant;

/// Timings of an output-only run on cached features.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CachedStats {
    /// Training examples cached.
    pub train_examples: usize,
    /// Epochs trained on the cache.
    pub epochs: usize,
    /// Seconds to compute the training and held-out features (the first epoch's extra cost).
    pub feature_seconds: f64,
    /// Median seconds of a cached epoch after the first.
    pub epoch_seconds: f64,
    /// Seconds of one FPT training step (in, out, LayerNorm, positions trained) of the same
    /// shape, median of timed steps after a warm-up.
    pub fpt_step_seconds: f64,
    /// `fpt_step_seconds` times the steps of one epoch.
    pub fpt_epoch_seconds: f64,
    /// `fpt_epoch_seconds / epoch_seconds`.
    pub speedup: f64,
}

/// Features and labels of `n` examples, in chunks of `chunk`.
fn cache(
    model: &fpt_model::Fpt,
    n: usize,
    chunk: usize,
    mut batch: impl FnMut(usize, usize) -> Result<fpt_tasks::Batch>,
) -> Result<(Tensor, Tensor)> {
    let (mut feats, mut labels) = (Vec::new(), Vec::new());
    let mut done = 0;
    while done < n {
        let k = chunk.min(n - done);
        let b = batch(done, k)?;
        let got = b.labels.dim(0)?;
        if got == 0 {
            break;
        }
        feats.push(model.features(&b.inputs, &mut Ctx::eval())?.detach().contiguous()?);
        labels.push(b.labels);
        done += got;
    }
    Ok((
        Tensor::cat(&feats, 0)?.contiguous()?,
        Tensor::cat(&labels, 0)?.contiguous()?,
    ))
}

/// The head's per-example outcomes on cached features.
fn score(model: &fpt_model::Fpt, feats: &Tensor, labels: &Tensor, chunk: usize) -> Result<crate::outcomes::Tally> {
    let n = feats.dim(0)?;
    let mut tally = crate::outcomes::Tally::default();
    let mut at = 0;
    while at < n {
        let k = chunk.min(n - at);
        let logits = model.head(&feats.narrow(0, at, k)?)?;
        let classes = logits.dim(2)?;
        let y = labels.narrow(0, at, k)?;
        let per_example = y.dim(1)?;
        tally.add(&logits.reshape(((), classes))?, &y.flatten_all()?, per_example)?;
        at += k;
    }
    Ok(tally)
}

/// Seconds of one FPT step of the same shape: median of 3 after a warm-up.
fn fpt_step_seconds(spec: &fpt_spec::RunSpec, device: &Device) -> Result<f64> {
    let mut s = spec.clone();
    s.train_groups = fpt_spec::TrainGroups::fpt();
    s.train.cached_epochs = None;
    s.model = fpt_spec::ModelKind::Fpt;
    let mut tr = Trainer::new(&s, device)?;
    tr.step()?;
    let mut times: Vec<f64> = (0..3)
        .map(|_| {
            let t = Instant::now();
            tr.step().map(|_| t.elapsed().as_secs_f64())
        })
        .collect::<Result<_>>()?;
    times.sort_by(f64::total_cmp);
    Ok(times[1])
}

/// Runs the output-only training of `tr` (its spec has `cached_epochs`) into `out_dir`.
pub(crate) fn run(
    mut tr: Trainer,
    out_dir: &Path,
    device: &Device,
    on_event: &mut dyn FnMut(&Event),
) -> Result<RunResult> {
    let spec = tr.spec.clone();
    let t = &spec.train;
    let epochs = t.cached_epochs.expect("checked by the caller");
    let counts = tr.model.param_counts();
    let weights = tr.weights.clone();
    let started = Instant::now();
    let n_train = match tr.task.splits().iter().find(|(name, _)| *name == "train") {
        Some((_, d)) => spec.task.train_examples.unwrap_or(d.len()).min(d.len()),
        None => t.steps * t.batch_size,
    };
    let chunk = tr.eval_batch_size();
    let feat_start = Instant::now();
    let mut rng = Rng::new(t.seed).fork("cached-train");
    let (train_f, train_y) = {
        let Trainer { task, model, .. } = &mut tr;
        cache(model, n_train, chunk, |_, k| Ok(task.train_batch(k, &mut rng, device)?))?
    };
    let n_test = tr.task.eval_len(Split::Test);
    let (test_f, test_y) = cache(&tr.model, n_test, chunk, |start, k| {
        Ok(tr.task.eval_batch(Split::Test, start, k, device)?)
    })?;
    let feature_seconds = feat_start.elapsed().as_secs_f64();
    let n = train_f.dim(0)?;
    let bs = t.batch_size.min(n).max(1);
    tracing::info!(
        "cached the features of {n} training and {} held-out examples in {feature_seconds:.1}s",
        test_f.dim(0)?
    );
    on_event(&Event::Started {
        trainable: counts.trainable,
        total: counts.total,
        weights: &weights,
        from_step: 0,
        steps: epochs * n.div_ceil(bs),
    });
    let vars: Vec<candle_core::Var> = tr.vars.clone();
    let mut adam = optim::Adam::new(vars.clone(), t.lr)?;
    let metrics = out_dir.join("metrics.jsonl");
    let mut epoch_times = Vec::with_capacity(epochs);
    let mut step = 0usize;
    let mut last = None;
    // The per-example scores the convergence rule can still need (as FPT runs keep them).
    let mut recent: Vec<crate::outcomes::EvalScores> = Vec::new();
    let window = crate::run_loop::plateau_window(t);
    let labels_per_example = tr.task.dims().labels_per_example;
    for _ in 0..epochs {
        let e_start = Instant::now();
        let perm = fpt_tasks::data::permutation(n, &mut rng);
        let (mut loss_sum, mut batches, mut grad_norm) = (0f64, 0usize, 0f64);
        for idx in perm.chunks(bs) {
            let ids = Tensor::from_vec(idx.iter().map(|&i| i as u32).collect::<Vec<_>>(), idx.len(), device)?;
            let logits = tr.model.head(&train_f.index_select(&ids, 0)?)?;
            let classes = logits.dim(2)?;
            let y = train_y.index_select(&ids, 0)?.flatten_all()?;
            let loss = ops::cross_entropy(&logits.reshape(((), classes))?, &y)?;
            let g = loss.backward()?;
            let mut grads: Vec<Tensor> = vars
                .iter()
                .map(|v| g.get(v.as_tensor()).cloned().map_or_else(|| v.zeros_like(), Ok))
                .collect::<candle_core::Result<_>>()?;
            grad_norm = match t.clip_norm {
                Some(c) => optim::clip_grad_norm(&mut grads, c)?,
                None => optim::grad_norm(&grads)?,
            };
            adam.lr = t.lr;
            adam.step(&grads)?;
            loss_sum += loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
            batches += 1;
            step += 1;
            on_event(&Event::Step {
                step,
                loss: loss_sum / batches as f64,
            });
        }
        epoch_times.push(e_start.elapsed().as_secs_f64());
        let eval_started = Instant::now();
        let tally = score(&tr.model, &test_f, &test_y, chunk)?;
        let (test_loss, test_accuracy) = tally.loss_and_accuracy();
        let rec = EvalRecord {
            step,
            train_loss: loss_sum / batches.max(1) as f64,
            test_loss,
            test_accuracy,
            train_accuracy: None,
            lr: t.lr,
            grad_norm,
            elapsed_s: started.elapsed().as_secs_f64(),
            examples: Some(tally.correct.len()),
            eval_s: Some(eval_started.elapsed().as_secs_f64()),
        };
        metrics_append(&metrics, &rec)?;
        on_event(&Event::Eval(&rec));
        recent.push(crate::outcomes::EvalScores::new(step, labels_per_example, &tally));
        crate::outcomes::keep_for_convergence(&mut recent, window);
        last = Some((rec, tally));
    }
    // The same rule as FPT runs': the last half of the run (in steps over the cached
    // features), paired over the examples.
    let plateau =
        crate::outcomes::convergence(&recent, window, t.converge_floor).filter(|p| p.to_step == last_step(&last));
    let converged = plateau.as_ref().is_some_and(|p| p.converged());
    let (last, last_tally) = last.expect("at least one epoch");
    let (_, train_accuracy) = score(&tr.model, &train_f, &train_y, chunk)?.loss_and_accuracy();
    let wall_seconds = started.elapsed().as_secs_f64();
    let mut after_first: Vec<f64> = epoch_times.iter().skip(1).copied().collect();
    if after_first.is_empty() {
        after_first = epoch_times.clone();
    }
    after_first.sort_by(f64::total_cmp);
    let epoch_seconds = after_first[after_first.len() / 2];
    let fpt_step = fpt_step_seconds(&spec, device)?;
    let fpt_epoch = fpt_step * n.div_ceil(t.batch_size) as f64;
    let evals: Vec<EvalRecord> = std::fs::read_to_string(&metrics)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let best = evals
        .iter()
        .max_by(|a, b| a.test_accuracy.total_cmp(&b.test_accuracy))
        .cloned()
        .unwrap_or_else(|| last.clone());
    let base = tr.task.baseline(Split::Test)?;
    let out = crate::outcomes::Outcomes::new(last.step, tr.task.dims().labels_per_example, &last_tally, &base);
    crate::outcomes::write(out_dir, &out)?;
    let losses: Vec<f64> = evals.iter().map(|e| e.train_loss).collect();
    let baseline = crate::outcomes::judge(&base, &out, &losses);
    let result = RunResult {
        task: spec.task.name.to_string(),
        backbone: spec.backbone.source.clone(),
        init: spec.backbone.init.to_string(),
        weights,
        train_groups: format!("{} (cached features)", spec.train_groups),
        precision: spec.backbone.precision,
        test_accuracy: last.test_accuracy,
        test_loss: last.test_loss.is_finite().then_some(last.test_loss),
        train_accuracy: Some(train_accuracy),
        best_accuracy: best.test_accuracy,
        best_step: best.step,
        converged_step: if converged {
            crate::RunState {
                evals: evals.clone(),
                ..Default::default()
            }
            .converged_step(t.convergence_tolerance)
        } else {
            None
        },
        final_train_loss: last.train_loss.is_finite().then_some(last.train_loss),
        steps: step,
        batch_size: t.batch_size,
        eval_examples: test_f.dim(0)?,
        trainable_params: counts.trainable,
        total_params: counts.total,
        wall_seconds,
        seed: t.seed,
        device: crate::device_name(device),
        diverged: false,
        diverged_at_step: None,
        diverged_reason: None,
        stopped_early: false,
        converged: Some(converged),
        bit_backbone: None,
        plateau,
        ended_at_baseline: false,
        baseline_accuracy: Some(baseline.accuracy),
        baseline: Some(baseline),
        cached: Some(CachedStats {
            train_examples: n,
            epochs,
            feature_seconds,
            epoch_seconds,
            fpt_step_seconds: fpt_step,
            fpt_epoch_seconds: fpt_epoch,
            speedup: fpt_epoch / epoch_seconds.max(1e-9),
        }),
        provenance: Some(crate::selfcheck::provenance()),
    };
    crate::tensorboard::close(out_dir)?;
    crate::write_result(out_dir, &result)?;
    Ok(result)
}

fn last_step(last: &Option<(EvalRecord, crate::outcomes::Tally)>) -> usize {
    last.as_ref().map_or(0, |(r, _)| r.step)
}
