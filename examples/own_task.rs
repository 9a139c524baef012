//! A task of your own, in Rust: implement [`fpt::tasks::Task`] and hand it to
//! [`fpt::train::train_task`]; the run gets the same run directory as `fpt train` (spec,
//! metrics, checkpoints, outcomes, `result.json` with its trivial baseline), and
//! [`fpt::train::resume_task`] continues it after an interruption.
//!
//! `cargo run --release --example own_task -- OUT_DIR [--resume]`: the majority of 9 bits
//! (given as 9 tokens of one value, +1 or -1), on a frozen random 2-layer GPT-2. Stop it
//! with Ctrl-C after a checkpoint and run it again with `--resume`: it ends with the numbers
//! an unbroken run has.

use fpt::candle_core::{Device, Tensor};
use fpt::nn::Rng;
use fpt::spec::{BackboneSpec, Init, RunSpec, ShapeOverrides, TaskName, TaskSpec, TrainSpec};
use fpt::tasks::{Batch, InputKind, Inputs, Split, Task, TaskDims};

/// The majority vote of `BITS` random bits.
struct Majority {
    /// The fixed held-out set (and a fixed sample of the training distribution).
    test: (Vec<f32>, Vec<u32>),
    train_sample: (Vec<f32>, Vec<u32>),
}

const BITS: usize = 9;

fn draw(n: usize, rng: &mut Rng) -> (Vec<f32>, Vec<u32>) {
    let mut x = Vec::with_capacity(n * BITS);
    let mut y = Vec::with_capacity(n);
    for _ in 0..n {
        let bits: Vec<bool> = (0..BITS).map(|_| rng.bit()).collect();
        x.extend(bits.iter().map(|&b| if b { 1.0 } else { -1.0 }));
        y.push(u32::from(bits.iter().filter(|&&b| b).count() > BITS / 2));
    }
    (x, y)
}

fn batch((x, y): (Vec<f32>, Vec<u32>), device: &Device) -> fpt::tasks::Result<Batch> {
    let n = y.len();
    Ok(Batch {
        inputs: Inputs::Vectors(Tensor::from_vec(x, (n, BITS, 1), device)?),
        labels: Tensor::from_vec(y, (n, 1), device)?,
    })
}

impl Majority {
    fn new(seed: u64) -> Self {
        let root = Rng::new(seed);
        Majority {
            test: draw(512, &mut root.fork("majority/test")),
            train_sample: draw(512, &mut root.fork("majority/train-sample")),
        }
    }
}

impl Task for Majority {
    fn name(&self) -> TaskName {
        TaskName::Custom
    }
    fn dims(&self) -> TaskDims {
        TaskDims {
            input: InputKind::Vectors { width: 1 },
            seq_len: BITS,
            readout_tokens: 1,
            labels_per_example: 1,
            classes: 2,
        }
    }
    fn train_batch(&mut self, n: usize, rng: &mut Rng, device: &Device) -> fpt::tasks::Result<Batch> {
        batch(draw(n, rng), device)
    }
    fn eval_len(&self, _split: Split) -> usize {
        self.test.1.len()
    }
    fn eval_batch(&self, split: Split, start: usize, n: usize, device: &Device) -> fpt::tasks::Result<Batch> {
        let (x, y) = match split {
            Split::Test => &self.test,
            Split::Train => &self.train_sample,
        };
        let end = (start + n).min(y.len());
        let start = start.min(end);
        batch((x[start * BITS..end * BITS].to_vec(), y[start..end].to_vec()), device)
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (out, resume) = match &args[..] {
        [_, out] => (out, false),
        [_, out, flag] if flag == "--resume" => (out, true),
        _ => return Err("usage: own_task OUT_DIR [--resume]".into()),
    };
    let out = std::path::Path::new(out);
    let device = Device::Cpu;
    let mut on_event = |e: &fpt::train::Event| {
        if let fpt::train::Event::Eval(r) = e {
            println!("step {:>5}: test accuracy {:.4}", r.step, r.test_accuracy);
        }
    };
    let result = if resume {
        fpt::train::resume_task(out, Box::new(Majority::new(0)), &device, &mut on_event)?
    } else {
        // The task settings are only recorded: the task is the one handed over.
        let spec = RunSpec {
            train: TrainSpec {
                steps: 1500,
                batch_size: 32,
                micro_batch_size: 32,
                eval_every: 250,
                checkpoint_every: Some(250),
                ..TrainSpec::default()
            },
            ..RunSpec::new(
                // A custom task's `path` names it: here, where it is written.
                TaskSpec {
                    path: Some("examples/own_task.rs: the majority of 9 bits".into()),
                    ..TaskSpec::new(TaskName::Custom)
                },
                BackboneSpec {
                    shape: ShapeOverrides {
                        layers: Some(2),
                        hidden: Some(64),
                        heads: Some(4),
                        ..Default::default()
                    },
                    ..BackboneSpec::new("gpt2", Init::Random)
                },
            )
        };
        fpt::train::train_task(&spec, Box::new(Majority::new(0)), out, &device, &mut on_event)?
    };
    let left = result.baseline.as_ref().is_some_and(|b| b.left);
    println!(
        "test accuracy {:.4} after {} steps ({} its trivial baseline); {}",
        result.test_accuracy,
        result.steps,
        if left { "off" } else { "at" },
        out.join("result.json").display()
    );
    Ok(())
}
