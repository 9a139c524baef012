//! The loop over a run directory: [`train`](crate::train) from scratch, [`resume`](crate::resume)
//! from a checkpoint, [`evaluate_run`](crate::evaluate_run) again; evaluations, divergence,
//! early stopping, the final outcomes and `result.json`.

#[allow(unused_imports)]
use super::*;

/// The training loop's running numbers, saved in every checkpoint.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RunState {
    /// Sum of step losses since the last evaluation.
    pub window_loss: f64,
    /// Steps since the last evaluation.
    pub window_steps: usize,
    /// Every evaluation so far.
    pub evals: Vec<EvalRecord>,
    /// Lines of `metrics.jsonl` written so far.
    pub metrics_lines: usize,
    /// Seconds of training in earlier segments.
    pub elapsed_s: f64,
    /// Consecutive evaluations without improvement (early stopping).
    pub stale_evals: usize,
    /// Learning rate and gradient norm of the last step.
    pub last_lr: f64,
    /// The loss of the run's first step: the reference for divergence (`divergence_factor`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_loss: Option<f64>,
    /// Gradient norm of the last step.
    pub last_grad_norm: f64,
    /// The per-example scores of the evaluations the convergence rule can still need (from
    /// the latest at or before half the run's steps, [`outcomes::keep_for_convergence`]):
    /// what decides `converged` and stops a run on its plateau.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recent: Vec<outcomes::EvalScores>,
}

/// The fewest evaluations the convergence test spans: `early_stop_patience`, else 3 (the
/// window is the last half of the run's steps where that holds more).
pub fn plateau_window(t: &fpt_spec::TrainSpec) -> usize {
    t.early_stop_patience.unwrap_or(3).max(1)
}

impl RunState {
    pub(crate) fn best(&self) -> Option<&EvalRecord> {
        self.evals.iter().fold(None, |b: Option<&EvalRecord>, e| match b {
            Some(b) if b.test_accuracy >= e.test_accuracy => Some(b),
            _ => Some(e),
        })
    }

    /// Steps to convergence (see the crate docs).
    pub fn converged_step(&self, tolerance: f64) -> Option<usize> {
        let best = self.best()?.test_accuracy;
        let mut candidate = None;
        for e in &self.evals {
            if e.test_accuracy >= best - tolerance {
                candidate.get_or_insert(e.step);
            } else {
                candidate = None;
            }
        }
        candidate
    }
}

pub(crate) fn evaluate_now(
    tr: &Trainer,
    stepper: &mut crate::replay_step::Stepper,
    run: &mut RunState,
    with_train: bool,
    started: &Instant,
    metrics: &Path,
) -> Result<(EvalRecord, outcomes::Tally)> {
    let _e = tracing::info_span!("eval", step = tr.steps_done()).entered();
    let eval_started = Instant::now();
    let tally = stepper.tally(tr, Split::Test)?;
    let (test_loss, test_accuracy) = tally.loss_and_accuracy();
    let train_accuracy = if with_train {
        Some(stepper.tally(tr, Split::Train)?.loss_and_accuracy().1)
    } else {
        None
    };
    let eval_s = eval_started.elapsed().as_secs_f64();
    let train_loss = if run.window_steps > 0 {
        run.window_loss / run.window_steps as f64
    } else {
        run.evals.last().map(|e| e.train_loss).unwrap_or(f64::NAN)
    };
    let rec = EvalRecord {
        step: tr.steps_done(),
        train_loss,
        test_loss,
        test_accuracy,
        train_accuracy,
        lr: run.last_lr,
        grad_norm: run.last_grad_norm,
        elapsed_s: run.elapsed_s + started.elapsed().as_secs_f64(),
        examples: Some(tally.correct.len()),
        eval_s: Some(eval_s),
    };
    metrics_append(metrics, &rec)?;
    run.metrics_lines += 1;
    (run.window_loss, run.window_steps) = (0.0, 0);
    run.evals.push(rec.clone());
    run.recent.push(outcomes::EvalScores::new(
        rec.step,
        tr.task().dims().labels_per_example,
        &tally,
    ));
    outcomes::keep_for_convergence(&mut run.recent, plateau_window(&tr.spec().train));
    Ok((rec, tally))
}

pub(crate) fn run_loop(
    mut tr: Trainer,
    mut run: RunState,
    out_dir: &Path,
    device: &Device,
    on_event: &mut dyn FnMut(&Event),
) -> Result<RunResult> {
    let started = Instant::now();
    let spec = tr.spec().clone();
    let t = &spec.train;
    let from_step = tr.steps_done();
    let counts = tr.model().param_counts();
    let weights = tr.weights().to_string();
    on_event(&Event::Started {
        trainable: counts.trainable,
        total: counts.total,
        weights: &weights,
        from_step: tr.steps_done(),
        steps: t.steps,
    });
    let metrics = out_dir.join("metrics.jsonl");
    let every_train = t.train_eval == TrainEval::Every;
    let mut diverged: Option<(usize, String)> = None;
    let mut stopped_early = false;
    // The trained tensors at the best evaluation so far (this segment of the run): what a
    // diverged run keeps.
    let mut best_params: Option<Vec<Tensor>> = None;
    // The latest evaluation's per-example outcomes, with its step.
    let mut last_tally: Option<(usize, outcomes::Tally)> = None;
    // The task's trivial baseline, for stopping within noise (built at the first evaluation).
    let mut stop_baseline: Option<fpt_tasks::Baseline> = None;
    let mut stepper = crate::replay_step::Stepper::for_run(&tr)?;
    while tr.steps_done() < t.steps {
        let out = stepper.step(&mut tr, t, run.evals.is_empty())?;
        let why = if !out.finite {
            // The update was skipped: the step did not happen.
            Some((
                tr.steps_done() + 1,
                format!("non-finite loss ({}) or gradient norm ({})", out.loss, out.grad_norm),
            ))
        } else {
            run.first_loss
                .filter(|&l0| out.loss > t.divergence_factor * l0)
                .map(|l0| {
                    (
                        tr.steps_done(),
                        format!(
                            "loss {:.4e} is above {} x the first step's {l0:.4e}",
                            out.loss, t.divergence_factor
                        ),
                    )
                })
        };
        if let Some((at, reason)) = why {
            on_event(&Event::Diverged(at));
            tracing::warn!(step = at, "diverged: {reason}; keeping the best evaluation before it");
            diverged = Some((at, reason));
            break;
        }
        run.first_loss.get_or_insert(out.loss);
        let step = tr.steps_done();
        run.window_loss += out.loss;
        run.window_steps += 1;
        run.last_lr = out.lr;
        run.last_grad_norm = out.grad_norm;
        on_event(&Event::Step { step, loss: out.loss });
        crate::tensorboard::log(
            out_dir,
            step,
            &[
                ("train/loss", out.loss),
                ("train/lr", out.lr),
                ("train/grad_norm", out.grad_norm),
            ],
            false,
        )?;
        if step.is_multiple_of(t.eval_every) || step == t.steps {
            let before = run.best().map(|b| b.test_accuracy);
            let with_train = every_train || (step == t.steps && t.train_eval == TrainEval::Final);
            let (rec, tally) = evaluate_now(&tr, &mut stepper, &mut run, with_train, &started, &metrics)?;
            last_tally = Some((rec.step, tally));
            on_event(&Event::Eval(&rec));
            if before.is_none_or(|b| rec.test_accuracy > b) {
                best_params = Some(
                    tr.model()
                        .trainable()
                        .iter()
                        .map(|(_, v)| v.as_tensor().copy())
                        .collect::<candle_core::Result<_>>()?,
                );
            }
            let judged = (t.stop_on_plateau || t.early_stop_within_noise) && t.early_stop_patience.is_some();
            let (tolerance, check) = if judged {
                let tally = &last_tally.as_ref().expect("just evaluated").1;
                let base = match &stop_baseline {
                    Some(b) => b,
                    None => stop_baseline.insert(tr.task().baseline(Split::Test)?),
                };
                let out = outcomes::Outcomes::new(rec.step, tr.task().dims().labels_per_example, tally, base);
                let losses: Vec<f64> = run.evals.iter().map(|e| e.train_loss).collect();
                let noise = 1.96 * std::f64::consts::SQRT_2 * outcomes::standard_error(&out.scores());
                (
                    t.convergence_tolerance.max(noise),
                    Some(outcomes::judge(base, &out, &losses)),
                )
            } else {
                (t.convergence_tolerance, None)
            };
            let at_baseline = check.as_ref().is_some_and(|c| !c.left);
            if t.stop_at_accuracy.is_some_and(|a| rec.test_accuracy >= a) && step < t.steps {
                // The target reached (a task pretrained until solved).
                stopped_early = true;
                on_event(&Event::StoppedEarly(step));
            } else if t.stop_on_plateau {
                // Converged by the rule: a full window of evaluations (the last half of the
                // run's steps, at least the patience), flat by its trend for the patience in
                // evaluations, and at or past the spec's floor. Off the baseline it has
                // converged; at it, it has ended there, but only with a floor (the paper's
                // count for its row and task): a plateau before learning is not an end.
                // Also ended at its baseline when it never learned at all (its training loss
                // never below the trivial predictor's) and is not rising past its floor
                // ([`crate::convergence::ended_at_baseline`]).
                let window = plateau_window(t);
                let call =
                    outcomes::convergence(&run.recent, window, t.converge_floor).filter(|_| run.evals.len() > window);
                let flat = call.as_ref().is_some_and(|p| p.converged());
                let ended = crate::convergence::ended_at_baseline(call.as_ref(), check.as_ref());
                if let Some(p) = t.early_stop_patience {
                    if ((flat && (!at_baseline || t.converge_floor.is_some())) || ended) && step < t.steps {
                        run.stale_evals = p;
                        stopped_early = true;
                        on_event(&Event::StoppedEarly(step));
                    }
                }
            } else {
                match before {
                    _ if at_baseline => run.stale_evals = 0,
                    Some(b) if rec.test_accuracy <= b + tolerance => run.stale_evals += 1,
                    _ => run.stale_evals = 0,
                }
                if t.early_stop_patience.is_some_and(|p| run.stale_evals >= p) && step < t.steps {
                    stopped_early = true;
                    on_event(&Event::StoppedEarly(step));
                }
            }
        }
        if t.checkpoint_every.is_some_and(|c| step.is_multiple_of(c)) && step < t.steps && !stopped_early {
            let mut snapshot = run.clone();
            snapshot.elapsed_s += started.elapsed().as_secs_f64();
            let dir = checkpoint::save(out_dir, &tr, &snapshot)?;
            on_event(&Event::Checkpoint(&dir));
        }
        if stopped_early {
            break;
        }
        if step < t.steps {
            if let Some(why) = crate::stop::due().filter(|_| stepper.settled()) {
                // A deadline or an interrupt: a checkpoint here, and the caller is told the
                // run stopped (not finished); resuming continues from this step.
                let mut snapshot = run.clone();
                snapshot.elapsed_s += started.elapsed().as_secs_f64();
                let dir = checkpoint::save(out_dir, &tr, &snapshot)?;
                on_event(&Event::Checkpoint(&dir));
                crate::tensorboard::close(out_dir)?;
                crate::history::append(
                    out_dir,
                    from_step,
                    step,
                    &started,
                    device,
                    &format!("stopped: {why}"),
                    stepper.replayed(),
                )?;
                return Err(TrainError::Stopped {
                    path: out_dir.to_path_buf(),
                    step,
                    steps: t.steps,
                    why,
                });
            }
        }
    }
    if diverged.is_some() {
        if let Some(params) = &best_params {
            // Back to the best evaluation's tensors: the checkpoint `fpt eval` reads is then
            // the run's best, never the diverged one.
            for ((_, var), p) in tr.model().trainable().iter().zip(params) {
                var.set(p)?;
            }
        }
    }
    // The last evaluation must describe the final parameters (a diverged run: the best
    // evaluation before divergence, when there is one).
    let need_final =
        (diverged.is_none() || run.evals.is_empty()) && run.evals.last().map(|e| e.step) != Some(tr.steps_done());
    let with_train = t.train_eval != TrainEval::Never && diverged.is_none();
    let last = if need_final || (with_train && run.evals.last().and_then(|e| e.train_accuracy).is_none()) {
        if !need_final {
            // Re-evaluate in place of the last record, now with train accuracy.
            if let Some(popped) = run.evals.pop() {
                if run.recent.last().is_some_and(|r| r.step == popped.step) {
                    run.recent.pop();
                }
            }
            run.metrics_lines -= 1;
            metrics_truncate(&metrics, run.metrics_lines)?;
        }
        let (rec, tally) = evaluate_now(&tr, &mut stepper, &mut run, with_train, &started, &metrics)?;
        last_tally = Some((rec.step, tally));
        on_event(&Event::Eval(&rec));
        rec
    } else if diverged.is_some() {
        run.best().cloned().expect("an evaluation exists")
    } else {
        run.evals.last().cloned().expect("an evaluation exists")
    };
    // The outcomes of the evaluation the result reports: this segment's, or (a run resumed
    // after its last evaluation, a diverged run put back to its best tensors) a fresh one of
    // the same tensors; none for a diverged run whose best tensors are not at hand.
    let tally = match last_tally {
        Some((step, tally)) if step == last.step && diverged.is_none() => Some(tally),
        _ if diverged.is_none() || best_params.is_some() => Some(stepper.tally(&tr, Split::Test)?),
        _ => None,
    };
    let baseline = match tally {
        Some(tally) => {
            // Built once: for stopping within noise, or now.
            let base = match stop_baseline.take() {
                Some(b) => b,
                None => tr.task().baseline(Split::Test)?,
            };
            let out = outcomes::Outcomes::new(last.step, tr.task().dims().labels_per_example, &tally, &base);
            outcomes::write(out_dir, &out)?;
            let losses: Vec<f64> = run.evals.iter().map(|e| e.train_loss).collect();
            Some(outcomes::judge(&base, &out, &losses))
        }
        None => None,
    };
    if let Some(b) = baseline.as_ref().filter(|b| !b.left) {
        tracing::warn!("the run is at its task's trivial baseline: {}", b.reasons.join("; "));
    }
    if let Some(b) = baseline.as_ref().filter(|b| !b.classes_only_in_eval.is_empty()) {
        tracing::warn!(
            "classes {:?} occur in the evaluated split but never in training: they cannot be learned, and count against the accuracy",
            b.classes_only_in_eval
        );
    }
    let mut snapshot = run.clone();
    snapshot.elapsed_s += started.elapsed().as_secs_f64();
    let best = run.best().cloned().expect("an evaluation exists");
    // Converged by the rule ([`outcomes::convergence`]): the last evaluation is on a plateau
    // over the last half of the run, at or past its floor (a diverged run, or one with a
    // single evaluation, did not show one).
    let plateau = match diverged {
        None => {
            outcomes::convergence(&run.recent, plateau_window(t), t.converge_floor).filter(|p| p.to_step == last.step)
        }
        Some(_) => None,
    };
    let converged = Some(plateau.as_ref().is_some_and(|p| p.converged()));
    // Ended at its baseline: past its floor, at the baseline, not rising, and flat by the rule
    // or never below the trivial predictor's training loss.
    let ended_at_baseline = crate::convergence::ended_at_baseline(plateau.as_ref(), baseline.as_ref());
    let result = RunResult {
        task: spec.task.name.to_string(),
        backbone: spec.backbone.source.clone(),
        init: spec.backbone.init.to_string(),
        weights,
        train_groups: spec.train_groups.to_string(),
        precision: spec.backbone.precision,
        test_accuracy: last.test_accuracy,
        test_loss: last.test_loss.is_finite().then_some(last.test_loss),
        train_accuracy: last.train_accuracy,
        best_accuracy: best.test_accuracy,
        best_step: best.step,
        // Steps to convergence only for a run that converged: one word, one meaning.
        converged_step: if converged == Some(true) {
            run.converged_step(t.convergence_tolerance)
        } else {
            None
        },
        final_train_loss: last.train_loss.is_finite().then_some(last.train_loss),
        steps: tr.steps_done(),
        batch_size: t.batch_size,
        eval_examples: tr.task().eval_len(Split::Test),
        trainable_params: counts.trainable,
        total_params: counts.total,
        wall_seconds: snapshot.elapsed_s,
        seed: t.seed,
        device: device_name(device),
        diverged: diverged.is_some(),
        diverged_at_step: diverged.as_ref().map(|d| d.0),
        diverged_reason: diverged.as_ref().map(|d| d.1.clone()),
        stopped_early,
        converged,
        plateau,
        ended_at_baseline,
        bit_backbone: tr.bit_backbone.clone(),
        baseline_accuracy: baseline.as_ref().map(|b| b.accuracy),
        baseline,
        cached: None,
        provenance: Some(selfcheck::provenance()),
    };
    crate::tensorboard::close(out_dir)?;
    // The result first: a run that trained to the end keeps its numbers even when its last
    // checkpoint cannot be written (a full disk); the error is still reported.
    write_result(out_dir, &result)?;
    let ended = match (&diverged, stopped_early, result.converged) {
        (Some(_), _, _) => "diverged",
        (None, _, _) if result.ended_at_baseline => "ended at its baseline (not rising there past its floor)",
        (None, true, _) => "ended: stopped early (converged or target reached)",
        (None, false, Some(true)) => "ended at its cap, converged",
        (None, false, _) => "ended at its cap, not converged",
    };
    crate::history::append(
        out_dir,
        from_step,
        tr.steps_done(),
        &started,
        device,
        ended,
        stepper.replayed(),
    )?;
    if diverged.is_none() || best_params.is_some() || checkpoint::latest(out_dir)?.is_none() {
        let dir = checkpoint::save(out_dir, &tr, &snapshot)?;
        on_event(&Event::Checkpoint(&dir));
    }
    Ok(result)
}

/// Runs `spec` from scratch in `out_dir`, which must not hold another run. Every
/// [`ModelKind`](fpt_spec::ModelKind) runs here: FPT through the training loop, output-only
/// on cached features, the linear baseline on the flattened input.
pub fn train(spec: &RunSpec, out_dir: &Path, device: &Device, on_event: &mut dyn FnMut(&Event)) -> Result<RunResult> {
    refuse_a_used_directory(out_dir)?;
    spec.validate()?;
    // Build (and so validate) everything before touching the run directory: a run that
    // cannot start leaves nothing behind.
    let built = match spec.model {
        ModelKind::Linear => Built::Linear(Box::new(linear_baseline::Linear::new(
            spec,
            fpt_tasks::build(&spec.task, &root_rng(spec))?,
            device,
        )?)),
        _ => Built::Trainer(Box::new(Trainer::new(spec, device)?)),
    };
    start(built, out_dir, device, on_event)
}

/// [`train`] on a task of your own (any [`Task`]: the spec's task settings are then only
/// recorded; name it `TaskName::Custom` with a `path` that says what it is), with the same
/// run directory, metrics, checkpoints, outcomes and result; the run continues with
/// [`resume_task`] and the same task. `examples/own_task.rs` shows one.
pub fn train_task(
    spec: &RunSpec,
    task: Box<dyn Task>,
    out_dir: &Path,
    device: &Device,
    on_event: &mut dyn FnMut(&Event),
) -> Result<RunResult> {
    refuse_a_used_directory(out_dir)?;
    spec.validate()?;
    start(build_with_task(spec, task, device)?, out_dir, device, on_event)
}

/// A run built and ready to start: the FPT trainer (FPT and output-only runs) or the
/// linear baseline.
enum Built {
    Trainer(Box<Trainer>),
    Linear(Box<linear_baseline::Linear>),
}

fn build_with_task(spec: &RunSpec, task: Box<dyn Task>, device: &Device) -> Result<Built> {
    Ok(match spec.model {
        ModelKind::Linear => Built::Linear(Box::new(linear_baseline::Linear::new(spec, task, device)?)),
        _ => Built::Trainer(Box::new(Trainer::with_task(spec, task, device)?)),
    })
}

/// Runs a built run from the beginning (the directory's metrics cleared first).
fn run_from_start(
    built: Built,
    out_dir: &Path,
    device: &Device,
    on_event: &mut dyn FnMut(&Event),
) -> Result<RunResult> {
    metrics_truncate(&out_dir.join("metrics.jsonl"), 0)?;
    match built {
        Built::Linear(l) => l.run(out_dir, on_event),
        Built::Trainer(tr) if tr.spec.model == ModelKind::OutputOnly => {
            output_only::run(*tr, out_dir, device, on_event)
        }
        Built::Trainer(tr) => run_loop(*tr, RunState::default(), out_dir, device, on_event),
    }
}

fn refuse_a_used_directory(out_dir: &Path) -> Result<()> {
    if out_dir.join("spec.json").exists() || checkpoint::root(out_dir).exists() {
        return Err(run_dir_err(
            out_dir,
            "already holds a run; continue it (resume), or choose another directory",
        ));
    }
    Ok(())
}

/// Runs a built run from scratch in `out_dir`.
fn start(built: Built, out_dir: &Path, device: &Device, on_event: &mut dyn FnMut(&Event)) -> Result<RunResult> {
    let spec = match &built {
        Built::Trainer(tr) => tr.spec.clone(),
        Built::Linear(l) => l.spec().clone(),
    };
    let _span = tracing::info_span!("run", task = %spec.task.name, backbone = %spec.backbone.source).entered();
    let created = !out_dir.exists();
    std::fs::create_dir_all(out_dir).map_err(|source| TrainError::Io {
        path: out_dir.to_path_buf(),
        source,
    })?;
    let lock = RunLock::acquire(out_dir)?;
    let started = (|| {
        write_atomic(
            &out_dir.join("spec.json"),
            serde_json::to_string_pretty(&spec).expect("spec serialises").as_bytes(),
        )?;
        run_from_start(built, out_dir, device, on_event)
    })();
    if started.is_err() && failed_at_start(out_dir) {
        // Nothing to resume (no evaluation, no checkpoint, no result): leave the directory
        // as it was, so the same --out can be used again.
        for f in ["spec.json", "metrics.jsonl"] {
            let _ = std::fs::remove_file(out_dir.join(f));
        }
        drop(lock);
        if created {
            let _ = std::fs::remove_dir(out_dir);
        }
    }
    started
}

/// Whether a run that stopped with an error left nothing worth resuming: no evaluation in
/// `metrics.jsonl`, no checkpoint, no result.
pub(crate) fn failed_at_start(out_dir: &Path) -> bool {
    let metrics_empty = std::fs::metadata(out_dir.join("metrics.jsonl")).map_or(true, |m| m.len() == 0);
    metrics_empty && !checkpoint::root(out_dir).exists() && !out_dir.join("result.json").exists()
}

/// Continues the run in `out_dir` from its latest checkpoint. If `spec` is given it must
/// equal the saved spec (a resume never silently changes a run). The resumed run ends
/// with the same numbers as an unbroken one.
pub fn resume(
    out_dir: &Path,
    spec: Option<&RunSpec>,
    device: &Device,
    on_event: &mut dyn FnMut(&Event),
) -> Result<RunResult> {
    let saved = saved_spec(out_dir)?;
    if let Some(s) = spec {
        let diffs = saved.differences(s);
        if !diffs.is_empty() {
            return Err(run_dir_err(
                out_dir,
                format!(
                    "resume with a changed spec is refused ({}); start a new run instead",
                    diffs.join("; ")
                ),
            ));
        }
    }
    let task = fpt_tasks::build(&saved.task, &root_rng(&saved))?;
    continue_run(build_with_task(&saved, task, device)?, out_dir, device, on_event)
}

/// [`resume`] of a run made with [`train_task`]: `task` must be the task it was started with.
pub fn resume_task(
    out_dir: &Path,
    task: Box<dyn Task>,
    device: &Device,
    on_event: &mut dyn FnMut(&Event),
) -> Result<RunResult> {
    let saved = saved_spec(out_dir)?;
    continue_run(build_with_task(&saved, task, device)?, out_dir, device, on_event)
}

/// Continues the run in `out_dir` with a run built from its saved spec.
fn continue_run(built: Built, out_dir: &Path, device: &Device, on_event: &mut dyn FnMut(&Event)) -> Result<RunResult> {
    let mut tr = match built {
        Built::Trainer(tr) if tr.spec.model == ModelKind::Fpt => *tr,
        // Output-only and linear runs keep no checkpoints (their state is one small layer):
        // they run again from the start.
        other => {
            let _lock = RunLock::acquire(out_dir)?;
            return run_from_start(other, out_dir, device, on_event);
        }
    };
    let saved = tr.spec.clone();
    let _span = tracing::info_span!("run", task = %saved.task.name, backbone = %saved.backbone.source).entered();
    let _lock = RunLock::acquire(out_dir)?;
    // What a killed writer left (a temporary pointer, a checkpoint never renamed in).
    checkpoint::sweep(out_dir);
    let run = match checkpoint::latest(out_dir)? {
        Some(dir) => {
            let loaded = checkpoint::load(&dir, device)?;
            tr.restore(&loaded, &dir)?;
            loaded.state.run
        }
        // Killed before its first checkpoint: start over.
        None => RunState::default(),
    };
    metrics_truncate(&out_dir.join("metrics.jsonl"), run.metrics_lines)?;
    crate::run_dir::mend_lines::<Segment>(&out_dir.join("history.jsonl"))?;
    let _ = std::fs::remove_file(out_dir.join("result.json"));
    run_loop(tr, run, out_dir, device, on_event)
}

/// Loads a finished (or checkpointed) run's trainable tensors over its backbone and
/// evaluates them on the test split and the training split: `(test_loss, test_accuracy,
/// train_accuracy, step)`.
pub fn evaluate_run(out_dir: &Path, device: &Device) -> Result<(f64, f64, f64, usize)> {
    let spec = saved_spec(out_dir)?;
    let mut tr = Trainer::new(&spec, device)?;
    let dir = checkpoint::latest(out_dir)?.ok_or_else(|| run_dir_err(out_dir, "has no checkpoint to evaluate"))?;
    let loaded = checkpoint::load(&dir, device)?;
    tr.restore(&loaded, &dir)?;
    let (test_loss, test_acc) = tr.evaluate(Split::Test)?;
    let (_, train_acc) = tr.evaluate(Split::Train)?;
    Ok((test_loss, test_acc, train_acc, tr.steps_done()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run that stopped before its first evaluation or checkpoint left nothing worth
    /// resuming (its directory is cleared); one with an evaluation, a checkpoint or a result
    /// did.
    #[test]
    fn failed_at_start_means_no_evaluation_checkpoint_or_result() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("spec.json"), "{}").unwrap();
        std::fs::write(d.path().join("metrics.jsonl"), "").unwrap();
        assert!(failed_at_start(d.path()));
        std::fs::write(d.path().join("metrics.jsonl"), "{\"step\": 10}\n").unwrap();
        assert!(!failed_at_start(d.path()));
        std::fs::write(d.path().join("metrics.jsonl"), "").unwrap();
        std::fs::create_dir_all(checkpoint::root(d.path())).unwrap();
        assert!(!failed_at_start(d.path()));
    }

    /// The run lock refuses a live holder and takes over a dead one's.
    #[test]
    fn the_run_lock_refuses_a_live_holder_and_takes_over_a_stale_one() {
        let d = tempfile::tempdir().unwrap();
        let first = RunLock::acquire(d.path()).unwrap();
        assert_eq!(
            std::fs::read_to_string(d.path().join(".lock")).unwrap(),
            std::process::id().to_string()
        );
        drop(first);
        assert!(!d.path().join(".lock").exists());
        // pid 1 is alive on Linux; a pid far beyond pid_max is not.
        if cfg!(target_os = "linux") {
            std::fs::write(d.path().join(".lock"), "1").unwrap();
            let e = RunLock::acquire(d.path()).err().unwrap().to_string();
            assert!(e.contains("process 1"), "{e}");
            std::fs::write(d.path().join(".lock"), "999999999").unwrap();
            let _taken = RunLock::acquire(d.path()).unwrap();
        }
    }

    /// Takers started together on one directory (threads here, each on its own open file,
    /// as separate processes are): exactly one holds the lock at a time, over many rounds;
    /// the others are refused with the holder named, and the winner's id is in `.lock`.
    #[test]
    fn takers_started_together_never_both_hold_the_run_lock() {
        for round in 0..40 {
            let d = tempfile::tempdir().unwrap();
            let gate = std::sync::Barrier::new(6);
            let held = std::sync::atomic::AtomicUsize::new(0);
            let outcomes: Vec<std::result::Result<(), String>> = std::thread::scope(|s| {
                let takers: Vec<_> = (0..6)
                    .map(|_| {
                        s.spawn(|| {
                            gate.wait();
                            let lock = RunLock::acquire(d.path()).map_err(|e| e.to_string())?;
                            let n = held.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            assert_eq!(n, 0, "round {round}: two takers hold the lock");
                            let pid = std::fs::read_to_string(d.path().join(".lock")).unwrap();
                            assert_eq!(pid, std::process::id().to_string());
                            std::thread::sleep(std::time::Duration::from_millis(150));
                            held.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                            drop(lock);
                            Ok(())
                        })
                    })
                    .collect();
                takers.into_iter().map(|t| t.join().unwrap()).collect()
            });
            let won = outcomes.iter().filter(|o| o.is_ok()).count();
            assert!(won >= 1, "round {round}: nobody took the lock: {outcomes:?}");
            for e in outcomes.iter().filter_map(|o| o.as_ref().err()) {
                assert!(e.contains("in use by"), "round {round}: {e}");
            }
            assert!(
                !d.path().join(".lock").exists(),
                "round {round}: the lock outlived its holders"
            );
        }
    }
}
