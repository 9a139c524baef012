//! The paper's synthetic bit tasks (§2.1), as in the reference code's
//! `datasets/bit_xor.py` and `datasets/bit_memory.py`.
//!
//! - **Bit XOR**: two strings of `n` bits in {0, 1}, `patch` bits per token (paper: n = 5,
//!   one bit per token, so 10 tokens of width 1); the label is their bitwise XOR.
//! - **Bit Memory**: five strings of `n` bits in {-1, +1} and a copy of one of them with each
//!   bit zeroed with probability 1/2 (paper: n = 1000, 50 bits per token, so 120 tokens of
//!   width 50); the label is the chosen string. Copying the visible bits and guessing the
//!   masked ones scores 75%.
//!
//! The output layer reads the last `n / patch` tokens, each giving 2 logits per bit of its
//! patch; the loss is a 2-way cross-entropy over all `n` bits and the accuracy is bit-level.
//! Training data is fresh for every batch. Two fixed sets are drawn from the seed: the test
//! set and a "train" sample (same distribution, own stream), for train-accuracy reports.

use crate::{Batch, InputKind, Inputs, Result, Split, Task, TaskDims, TaskError};
use candle_core::Device;
use fpt_nn::Rng;
use fpt_spec::TaskName;

/// Examples stored flat on the CPU: `x` is `[n, tokens * width]`, `y` is `[n, labels]`.
struct Examples {
    x: Vec<f32>,
    y: Vec<u32>,
}

fn to_batch(x: Vec<f32>, y: Vec<u32>, n: usize, dims: &TaskDims, device: &Device) -> Result<Batch> {
    let width = match dims.input {
        InputKind::Vectors { width } => width,
        InputKind::Tokens { .. } => unreachable!("bit tasks take vectors"),
    };
    Ok(Batch {
        inputs: Inputs::Vectors(fpt_nn::transfer::upload(x, (n, dims.seq_len, width), device)?),
        labels: fpt_nn::transfer::upload(y, (n, dims.labels_per_example), device)?,
    })
}

fn slice_batch(e: &Examples, start: usize, n: usize, total: usize, dims: &TaskDims, device: &Device) -> Result<Batch> {
    let start = start.min(total);
    let n = n.min(total - start);
    let xw = e.x.len() / total;
    let yw = e.y.len() / total;
    to_batch(
        e.x[start * xw..(start + n) * xw].to_vec(),
        e.y[start * yw..(start + n) * yw].to_vec(),
        n,
        dims,
        device,
    )
}

/// The two fixed evaluation sets of a generated task.
struct EvalSets {
    test: Examples,
    train_sample: Examples,
    len: usize,
}

impl EvalSets {
    /// Draws both sets with `generate` from forks of the run's `root` named after `task`.
    fn draw(task: &str, len: usize, root: &Rng, generate: impl Fn(usize, &mut Rng) -> Examples) -> Self {
        let base = root;
        Self {
            test: generate(len, &mut base.fork(&format!("{task}/eval"))),
            train_sample: generate(len, &mut base.fork(&format!("{task}/train-sample"))),
            len,
        }
    }

    fn batch(&self, split: Split, start: usize, n: usize, dims: &TaskDims, device: &Device) -> Result<Batch> {
        let set = match split {
            Split::Test => &self.test,
            Split::Train => &self.train_sample,
        };
        slice_batch(set, start, n, self.len, dims, device)
    }
}

fn check(task: &'static str, n: usize, patch: usize) -> Result<()> {
    if n == 0 || patch == 0 || !n.is_multiple_of(patch) {
        return Err(TaskError::Invalid {
            task,
            msg: format!("n_bits {n} must be a positive multiple of patch {patch}"),
        });
    }
    Ok(())
}

/// Bit XOR (see the module docs).
pub struct BitXor {
    n: usize,
    patch: usize,
    eval: EvalSets,
}

impl BitXor {
    /// `n` bits per string, `patch` bits per token, `eval_len` held-out examples drawn from
    /// a fork of the run's `root` generator.
    pub fn new(n: usize, patch: usize, eval_len: usize, root: &Rng) -> Result<Self> {
        check("bit-xor", n, patch)?;
        let eval = EvalSets::draw("bit-xor", eval_len, root, |c, r| Self::generate(n, c, r));
        Ok(Self { n, patch, eval })
    }

    fn generate(n: usize, count: usize, rng: &mut Rng) -> Examples {
        let mut x = Vec::with_capacity(count * 2 * n);
        let mut y = Vec::with_capacity(count * n);
        for _ in 0..count {
            let a: Vec<u32> = (0..n).map(|_| rng.bit() as u32).collect();
            let b: Vec<u32> = (0..n).map(|_| rng.bit() as u32).collect();
            x.extend(a.iter().chain(&b).map(|&v| v as f32));
            y.extend(a.iter().zip(&b).map(|(p, q)| p ^ q));
        }
        Examples { x, y }
    }
}

impl BitXor {
    fn generate_train(&self, count: usize, rng: &mut Rng) -> Examples {
        Self::generate(self.n, count, rng)
    }
}

impl Task for BitXor {
    fn name(&self) -> TaskName {
        TaskName::BitXor
    }
    fn dims(&self) -> TaskDims {
        TaskDims {
            input: InputKind::Vectors { width: self.patch },
            seq_len: 2 * self.n / self.patch,
            readout_tokens: self.n / self.patch,
            labels_per_example: self.n,
            classes: 2,
        }
    }
    fn train_batch(&mut self, n: usize, rng: &mut Rng, device: &Device) -> Result<Batch> {
        let e = self.generate_train(n, rng);
        to_batch(e.x, e.y, n, &self.dims(), device)
    }
    fn eval_len(&self, _split: Split) -> usize {
        self.eval.len
    }
    fn eval_batch(&self, split: Split, start: usize, n: usize, device: &Device) -> Result<Batch> {
        self.eval.batch(split, start, n, &self.dims(), device)
    }
}

/// Bit Memory (see the module docs).
pub struct BitMemory {
    n: usize,
    patterns: usize,
    patch: usize,
    eval: EvalSets,
}

impl BitMemory {
    /// `n` bits per string, `patterns` strings, `patch` bits per token, `eval_len` held-out
    /// examples drawn from a fork of the run's `root` generator.
    pub fn new(n: usize, patterns: usize, patch: usize, eval_len: usize, root: &Rng) -> Result<Self> {
        check("bit-memory", n, patch)?;
        if patterns == 0 {
            return Err(TaskError::Invalid {
                task: "bit-memory",
                msg: "needs at least one pattern".into(),
            });
        }
        let eval = EvalSets::draw("bit-memory", eval_len, root, |c, r| Self::generate(n, patterns, c, r));
        Ok(Self {
            n,
            patterns,
            patch,
            eval,
        })
    }

    fn generate(n: usize, k: usize, count: usize, rng: &mut Rng) -> Examples {
        let mut x = Vec::with_capacity(count * (k + 1) * n);
        let mut y = Vec::with_capacity(count * n);
        for _ in 0..count {
            let start = x.len();
            for _ in 0..k * n {
                x.push(if rng.bit() { 1.0 } else { -1.0 });
            }
            let q = rng.below(k as u64) as usize;
            for i in 0..n {
                let bit = x[start + q * n + i];
                let masked = if rng.bit() { bit } else { 0.0 };
                x.push(masked);
                y.push(u32::from(bit > 0.0));
            }
        }
        Examples { x, y }
    }
}

impl BitMemory {
    fn generate_train(&self, count: usize, rng: &mut Rng) -> Examples {
        Self::generate(self.n, self.patterns, count, rng)
    }
}

impl Task for BitMemory {
    fn name(&self) -> TaskName {
        TaskName::BitMemory
    }
    fn dims(&self) -> TaskDims {
        TaskDims {
            input: InputKind::Vectors { width: self.patch },
            seq_len: (self.patterns + 1) * self.n / self.patch,
            readout_tokens: self.n / self.patch,
            labels_per_example: self.n,
            classes: 2,
        }
    }
    fn train_batch(&mut self, n: usize, rng: &mut Rng, device: &Device) -> Result<Batch> {
        let e = self.generate_train(n, rng);
        to_batch(e.x, e.y, n, &self.dims(), device)
    }
    fn eval_len(&self, _split: Split) -> usize {
        self.eval.len
    }
    fn eval_batch(&self, split: Split, start: usize, n: usize, device: &Device) -> Result<Batch> {
        self.eval.batch(split, start, n, &self.dims(), device)
    }
    fn baseline(&self, split: Split) -> Result<crate::Baseline> {
        crate::baseline::copy_visible_bits(self, split, self.n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xor_labels_are_the_xor_of_the_two_strings() {
        let mut t = BitXor::new(5, 1, 8, &fpt_nn::Rng::new(0)).unwrap();
        let d = t.dims();
        assert_eq!(
            (d.seq_len, d.readout_tokens, d.labels_per_example, d.output_dim()),
            (10, 5, 5, 2)
        );
        let b = t.train_batch(64, &mut Rng::new(1), &Device::Cpu).unwrap();
        let Inputs::Vectors(x) = &b.inputs else { panic!() };
        let x = x.squeeze(2).unwrap().to_vec2::<f32>().unwrap();
        let y = b.labels.to_vec2::<u32>().unwrap();
        for (xr, yr) in x.iter().zip(&y) {
            for i in 0..5 {
                assert_eq!((xr[i] != xr[5 + i]) as u32, yr[i]);
            }
        }
    }

    #[test]
    fn memory_query_is_a_masked_copy_of_one_pattern() {
        let mut t = BitMemory::new(100, 5, 10, 4, &fpt_nn::Rng::new(0)).unwrap();
        let d = t.dims();
        assert_eq!((d.seq_len, d.readout_tokens, d.output_dim()), (60, 10, 20));
        let b = t.train_batch(32, &mut Rng::new(2), &Device::Cpu).unwrap();
        let Inputs::Vectors(x) = &b.inputs else { panic!() };
        let x = x.reshape((32, 600)).unwrap().to_vec2::<f32>().unwrap();
        let y = b.labels.to_vec2::<u32>().unwrap();
        let mut visible = 0;
        for (xr, yr) in x.iter().zip(&y) {
            let query = &xr[500..];
            // The label is one of the five patterns, and every visible query bit agrees with it.
            let matches = (0..5)
                .filter(|p| (0..100).all(|i| (xr[p * 100 + i] > 0.0) as u32 == yr[i]))
                .count();
            assert!(matches >= 1);
            for i in 0..100 {
                if query[i] != 0.0 {
                    visible += 1;
                    assert_eq!((query[i] > 0.0) as u32, yr[i]);
                }
            }
        }
        let frac = visible as f64 / (32.0 * 100.0);
        assert!((frac - 0.5).abs() < 0.05, "{frac}");
    }

    #[test]
    fn eval_set_is_fixed_by_the_seed() {
        let get = |seed: u64, split: Split| {
            let b = BitXor::new(5, 1, 16, &fpt_nn::Rng::new(seed))
                .unwrap()
                .eval_batch(split, 0, 16, &Device::Cpu)
                .unwrap();
            b.labels.to_vec2::<u32>().unwrap()
        };
        assert_eq!(get(7, Split::Test), get(7, Split::Test));
        assert_ne!(get(7, Split::Test), get(8, Split::Test));
        assert_ne!(get(7, Split::Test), get(7, Split::Train));
        assert!(BitXor::new(5, 2, 4, &fpt_nn::Rng::new(0)).is_err());
    }
}
