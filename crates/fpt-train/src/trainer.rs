//! [`Trainer`]: one run's task, model, optimizer and random streams, and its step
//! (micro-batches, gradient accumulation, clipping, Adam).

#[allow(unused_imports)]
use super::*;

/// A run in progress: the task, the model, the optimizer and the random streams.
pub struct Trainer {
    pub(crate) spec: RunSpec,
    pub(crate) device: Device,
    pub(crate) task: Box<dyn Task>,
    pub(crate) model: Fpt,
    pub(crate) vars: Vec<Var>,
    pub(crate) adam: optim::Adam,
    pub(crate) data_rng: Rng,
    pub(crate) ctx: Ctx,
    pub(crate) weights: String,
    pub(crate) step: usize,
    /// How a Bit backbone's pretraining ended (a `bit-pretrained` spec).
    pub(crate) bit_backbone: Option<pretrain::BitBackbone>,
}

/// What one optimizer step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepOutcome {
    /// Mean training loss of the step's micro-batches.
    pub loss: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Learning rate used.
    pub lr: f64,
    /// False when the loss or gradient was not finite; the update was then skipped.
    pub finite: bool,
}

/// The run's root generator, `Rng::new(spec.train.seed)`: every random stream of a run is a
/// named fork of it, the trainer's `init` (weights), `data` (batches) and `dropout`, and the
/// task's (`fpt_tasks::build`: evaluation sets, samples, the training order).
pub fn root_rng(spec: &RunSpec) -> Rng {
    Rng::new(spec.train.seed)
}

impl Trainer {
    /// Builds everything `spec` describes on `device`.
    pub fn new(spec: &RunSpec, device: &Device) -> Result<Self> {
        spec.validate()?;
        Self::with_task(spec, fpt_tasks::build(&spec.task, &root_rng(spec))?, device)
    }

    /// Builds the run of `spec` on another task than the one it names (benchmarks use
    /// [`fpt_tasks::Synthetic`]).
    pub fn with_task(spec: &RunSpec, task: Box<dyn Task>, device: &Device) -> Result<Self> {
        spec.validate()?;
        if spec.model == ModelKind::Linear {
            return Err(fpt_spec::SpecError::Invalid {
                field: "model",
                msg: "the linear baseline has no FPT trainer; run it with fpt_train::train".into(),
            }
            .into());
        }
        let t = &spec.train;
        let master = root_rng(spec);
        let mut init_rng = master.fork("init");
        // Sizes are within fpt's limits (validated); check the whole against this machine
        // before anything is allocated (or a Bit backbone trained).
        let (config, pspecs) = fpt_backbones::param_specs(&spec.backbone)?;
        // Examples longer than a learned position table are refused first: that, not the
        // memory a too-long sequence would need, is what the user must change.
        let positions = pspecs
            .iter()
            .find(|p| p.role == fpt_spec::Role::Positions && p.shape.len() == 2)
            .map(|p| p.shape[0]);
        let seq_len = task.dims().seq_len;
        if let Some(max) = positions.filter(|&m| seq_len > m) {
            return Err(fpt_model::ModelError::Mismatch(format!(
                "task {}: the task's examples are {seq_len} tokens long but the backbone has {max} positions: cut them with \
                 --max-len {max} (token tasks), or use a backbone with a larger position table (random init: --positions)",
                spec.task.label()
            ))
            .into());
        }
        let estimate = memory::estimate(
            spec,
            &pspecs,
            (config.hidden_size(), config.layers(), config.heads()),
            &task.dims(),
        );
        if device.is_cpu() {
            // (On a GPU the device's memory is what counts; its allocator reports itself.)
            memory::check(&estimate).map_err(TrainError::TooBig)?;
        }
        let source = pretrain::resolve_backbone(&spec.backbone, device)?;
        let bit_backbone = pretrain::bit_backbone(&spec.backbone);
        let mut backbone = fpt_backbones::load(&source, &spec.train_groups, device, &mut init_rng)?;
        backbone.set_dropout(spec.backbone_dropout);
        let weights = backbone.origin().to_string();
        let head = HeadConfig {
            input_dropout: spec.input_dropout,
            orth_gain: spec.orth_gain,
            input_init: spec.input_init,
        };
        let model =
            Fpt::new(backbone, task.dims(), spec.train_groups, head, device, &mut init_rng).map_err(|e| match e {
                fpt_model::ModelError::Mismatch(m) => {
                    fpt_model::ModelError::Mismatch(format!("task {}: {m}", spec.task.label()))
                }
                e => e,
            })?;
        let vars: Vec<_> = model.trainable().into_iter().map(|(_, v)| v).collect();
        if vars.is_empty() {
            return Err(TrainError::NothingToTrain(spec.train_groups.to_string()));
        }
        let adam = optim::Adam::new(vars.clone(), t.lr)?;
        Ok(Self {
            spec: spec.clone(),
            device: device.clone(),
            task,
            model,
            vars,
            adam,
            data_rng: master.fork("data"),
            ctx: Ctx {
                train: true,
                rng: master.fork("dropout"),
                attention: None,
            },
            weights,
            step: 0,
            bit_backbone,
        })
    }

    /// The spec this trainer runs.
    pub fn spec(&self) -> &RunSpec {
        &self.spec
    }

    /// The model.
    pub fn model(&self) -> &Fpt {
        &self.model
    }

    /// The optimizer.
    pub fn optimizer(&self) -> &optim::Adam {
        &self.adam
    }

    /// The task.
    pub fn task(&self) -> &dyn Task {
        self.task.as_ref()
    }

    /// Where the backbone's weights came from.
    pub fn weights(&self) -> &str {
        &self.weights
    }

    /// Optimizer steps taken.
    pub fn steps_done(&self) -> usize {
        self.step
    }

    /// Restores parameters, optimizer state and random streams from a checkpoint, after
    /// checking that it belongs to this run's spec.
    pub fn restore(&mut self, loaded: &checkpoint::Loaded, path: &Path) -> Result<()> {
        let diffs = loaded.state.spec.differences(&self.spec);
        if !diffs.is_empty() {
            return Err(TrainError::Checkpoint {
                path: path.to_path_buf(),
                msg: format!("belongs to another run spec ({})", diffs.join("; ")),
            });
        }
        checkpoint::load_trainable(&self.model, &loaded.trainable, path)?;
        let names: Vec<String> = self.model.trainable().into_iter().map(|(n, _)| n).collect();
        let mut m = Vec::new();
        let mut v = Vec::new();
        for (n, var) in names.iter().zip(&self.vars) {
            for (prefix, out) in [("m", &mut m), ("v", &mut v)] {
                let key = format!("{prefix}.{n}");
                let t = loaded.moments.get(&key).ok_or_else(|| TrainError::Checkpoint {
                    path: path.to_path_buf(),
                    msg: format!("optimizer state lacks `{key}`"),
                })?;
                if t.dims() != var.dims() {
                    return Err(TrainError::Checkpoint {
                        path: path.to_path_buf(),
                        msg: format!(
                            "optimizer tensor `{key}` has shape {:?}, expected {:?}",
                            t.dims(),
                            var.dims()
                        ),
                    });
                }
                out.push(t.clone());
            }
        }
        self.adam.restore(loaded.state.adam_t, m, v)?;
        self.data_rng = loaded.state.data_rng.clone();
        self.ctx.rng = loaded.state.dropout_rng.clone();
        if let Some(c) = loaded.state.data_cursor {
            self.task.set_cursor(c)?;
        }
        self.step = loaded.state.step;
        Ok(())
    }

    /// Forward and backward on one fresh training micro-batch; returns its loss and the
    /// gradient store (which holds gradients of trainable tensors only).
    pub fn micro_batch_grads(&mut self) -> Result<(f64, candle_core::backprop::GradStore)> {
        let (loss, grads) = self.micro_batch_loss()?;
        Ok((fpt_nn::transfer::download_scalar::<f64>(&loss)?, grads))
    }

    /// [`Trainer::micro_batch_grads`] with the loss left where it was computed (a one-element
    /// f64 tensor), so a GPU step need not wait for it.
    fn micro_batch_loss(&mut self) -> Result<(Tensor, candle_core::backprop::GradStore)> {
        let loss = self.micro_batch_graph()?;
        let grads = loss.backward()?;
        Ok((loss.detach().to_dtype(DType::F64)?.reshape(1)?, grads))
    }

    /// A fresh training micro-batch's loss, its autograd graph still attached.
    fn micro_batch_graph(&mut self) -> Result<Tensor> {
        let batch = self.draw_batch()?;
        self.loss_on(&batch)
    }

    /// The next training micro-batch, drawn as a step draws it (the data stream advances).
    pub fn draw_batch(&mut self) -> Result<fpt_tasks::Batch> {
        let n = self.spec.train.micro_batch_size;
        Ok(self.task.train_batch(n, &mut self.data_rng, &self.device)?)
    }

    /// `batch`'s loss, its autograd graph attached.
    pub(crate) fn loss_on(&mut self, batch: &fpt_tasks::Batch) -> Result<Tensor> {
        let logits = self.model.forward(&batch.inputs, &mut self.ctx)?;
        let classes = logits.dim(2)?;
        Ok(ops::cross_entropy(
            &logits.reshape(((), classes))?,
            &batch.labels.flatten_all()?,
        )?)
    }

    /// How many nodes of a fresh micro-batch's graph candle's backward gives a gradient of
    /// its own (every node but the trained tensors themselves): each starts as a zero
    /// tensor and is added into, what the residual branch's node saves on a GPU
    /// ([`fpt_nn::with_branch`] picks the branch; the micro-batch is drawn as a step draws it).
    pub fn backward_nodes(&mut self) -> Result<usize> {
        let loss = fpt_nn::on_pool(|| self.micro_batch_graph())?;
        Ok(loss.sorted_nodes().iter().filter(|n| !n.is_variable()).count())
    }

    /// One optimizer step: gradients averaged over `batch_size / micro_batch_size`
    /// micro-batches, clipped, then Adam at the scheduled rate. A non-finite loss or
    /// gradient skips the update. Runs on a worker of rayon's pool ([`fpt_nn::on_pool`]).
    ///
    /// Nothing is read back from the device until the gradients are clipped: then the
    /// micro-batches' losses and the gradient norm come back in one copy (the step needs
    /// them to skip a non-finite update), so a step's copies are its batches' uploads and
    /// that one download ([`fpt_nn::transfer`]; tested in `tests/transfers.rs`).
    pub fn step(&mut self) -> Result<StepOutcome> {
        fpt_nn::on_pool(|| self.step_here())
    }

    fn step_here(&mut self) -> Result<StepOutcome> {
        let t = &self.spec.train;
        let accum = t.batch_size / t.micro_batch_size;
        let clip = t.clip_norm;
        let lr = t.lr_schedule.lr_at(t.lr, self.step + 1, t.steps);
        let mut sums: Vec<Option<Tensor>> = vec![None; self.vars.len()];
        let mut losses = Vec::with_capacity(accum + 1);
        for _ in 0..accum {
            let (l, grads) = self.micro_batch_loss()?;
            losses.push(l);
            for (slot, var) in sums.iter_mut().zip(&self.vars) {
                if let Some(g) = grads.get(var.as_tensor()) {
                    *slot = Some(match slot.take() {
                        Some(s) => (s + g)?,
                        None => g.clone(),
                    });
                }
            }
        }
        let mut grads: Vec<Tensor> = sums
            .into_iter()
            .zip(&self.vars)
            .map(|(g, v)| match g {
                Some(g) if accum > 1 => g / accum as f64,
                Some(g) => Ok(g),
                None => v.zeros_like(),
            })
            .collect::<candle_core::Result<_>>()?;
        losses.push(optim::clip_grad_norm_in_place(&mut grads, clip)?.reshape(1)?);
        let read = fpt_nn::transfer::download_vec::<f64>(&Tensor::cat(&losses, 0)?)?;
        let (grad_norm, micro) = read.split_last().expect("the norm and at least one loss");
        let loss = micro.iter().fold(0f64, |acc, l| acc + l / accum as f64);
        let grad_norm = *grad_norm;
        let finite = loss.is_finite() && grad_norm.is_finite();
        if finite {
            self.adam.lr = lr;
            self.adam.step(&grads)?;
            self.step += 1;
        }
        Ok(StepOutcome {
            loss,
            grad_norm,
            lr,
            finite,
        })
    }

    /// Examples per evaluation forward pass: up to 64, fewer for long sequences (a forward
    /// pass keeps every layer's `batch x heads x tokens^2` attention alive while trainable
    /// tensors take part), never fewer than the training micro-batch.
    pub fn eval_batch_size(&self) -> usize {
        let t = self.task.dims().seq_len.max(1);
        (((1usize << 20) / (t * t)).clamp(1, 64)).max(self.spec.train.micro_batch_size)
    }

    /// Loss and accuracy on a whole evaluation split.
    pub fn evaluate(&self, split: Split) -> Result<(f64, f64)> {
        Ok(self.tally(split)?.loss_and_accuracy())
    }

    /// The per-example outcomes of an evaluation of a whole split.
    pub fn tally(&self, split: Split) -> Result<outcomes::Tally> {
        let mut ctx = Ctx::eval();
        let model = &self.model;
        fpt_nn::no_grad(|| {
            tally_with(
                self.task.as_ref(),
                split,
                self.eval_batch_size(),
                &self.device,
                &mut |inputs| Ok(fpt_nn::on_pool(|| model.forward(inputs, &mut ctx))?),
            )
        })
    }
}
