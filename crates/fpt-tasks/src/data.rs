//! The dataset machinery every real task shares: examples held compactly in memory
//! ([`Dataset`]), how a batch of them becomes model input ([`Encoding`]: image patches with
//! seeded augmentation, padded token ids, padded feature vectors), and the [`DatasetTask`]
//! that walks the training set in seeded epoch permutations.
//!
//! Exact resumption: the order of epoch `e` is a permutation drawn from `(seed, e)` alone, and
//! the position in it is a [`Cursor`] that checkpoints store; augmentation draws from the
//! trainer's data stream, which checkpoints store too. A resumed run therefore sees the same
//! batches, augmented the same way, as an unbroken one.

use crate::{Batch, InputKind, Inputs, Result, Split, Task, TaskDims, TaskError};
use candle_core::Device;
use fpt_nn::Rng;
use fpt_spec::TaskName;

/// Where the training order stands: epoch and examples already taken from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Cursor {
    /// Epochs completed.
    pub epoch: u64,
    /// Examples taken from the current epoch's permutation.
    pub position: u64,
}

/// Examples of one split, stored compactly on the CPU.
#[derive(Debug, Clone)]
pub enum Examples {
    /// `u8` images, `[n, height, width, channels]` row-major.
    Images {
        /// Height in pixels.
        height: usize,
        /// Width in pixels.
        width: usize,
        /// Channels (1 or 3).
        channels: usize,
        /// The pixels.
        pixels: Vec<u8>,
    },
    /// Token-id sequences (already cut to the task's maximum length).
    Tokens(Vec<Vec<u32>>),
    /// Sequences of `width`-wide vectors, each flat `[len * width]`.
    Features {
        /// Width of each vector.
        width: usize,
        /// The sequences.
        seqs: Vec<Vec<f32>>,
    },
}

/// One split: examples, one label each, and (for sequences) the length each had before it
/// was cut to the maximum length.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// The examples.
    pub examples: Examples,
    /// Class id of each example.
    pub labels: Vec<u32>,
    /// Original sequence lengths (empty for images).
    pub lengths: Vec<u32>,
}

impl Dataset {
    /// Number of examples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The examples at `idx`, in that order.
    pub fn select(&self, idx: &[usize]) -> Dataset {
        let examples = match &self.examples {
            Examples::Images {
                height,
                width,
                channels,
                pixels,
            } => {
                let size = height * width * channels;
                let mut out = Vec::with_capacity(idx.len() * size);
                for &i in idx {
                    out.extend_from_slice(&pixels[i * size..(i + 1) * size]);
                }
                Examples::Images {
                    height: *height,
                    width: *width,
                    channels: *channels,
                    pixels: out,
                }
            }
            Examples::Tokens(s) => Examples::Tokens(idx.iter().map(|&i| s[i].clone()).collect()),
            Examples::Features { width, seqs } => Examples::Features {
                width: *width,
                seqs: idx.iter().map(|&i| seqs[i].clone()).collect(),
            },
        };
        Dataset {
            examples,
            labels: idx.iter().map(|&i| self.labels[i]).collect(),
            lengths: if self.lengths.is_empty() {
                Vec::new()
            } else {
                idx.iter().map(|&i| self.lengths[i]).collect()
            },
        }
    }

    /// A fixed sample of `n` examples drawn with `rng` (kept in file order), or all of them
    /// when `n` is 0 or at least the split's size.
    pub fn sample(&self, n: usize, rng: &mut Rng) -> Dataset {
        if n == 0 || n >= self.len() {
            return self.clone();
        }
        let mut idx = permutation(self.len(), rng);
        idx.truncate(n);
        idx.sort_unstable();
        self.select(&idx)
    }

    /// Length (tokens or vectors) of example `i` as stored.
    pub fn seq_len(&self, i: usize) -> usize {
        match &self.examples {
            Examples::Images { .. } => 0,
            Examples::Tokens(s) => s[i].len(),
            Examples::Features { width, seqs } => seqs[i].len() / width,
        }
    }
}

/// A uniformly random permutation of `0..n` (Fisher-Yates).
pub fn permutation(n: usize, rng: &mut Rng) -> Vec<usize> {
    let mut p: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        p.swap(i, j);
    }
    p
}

/// Training-time image augmentation (the reference code's torchvision transforms).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Augment {
    /// Zero padding before a random crop back to the original size (torchvision
    /// `RandomCrop(32, padding=4)`).
    pub crop_padding: usize,
    /// Mirror left-right with probability 1/2.
    pub flip: bool,
    /// Rotate by a uniform angle in `[-max, max]` degrees, nearest neighbour, zero fill.
    pub rotate_degrees: f64,
}

impl Augment {
    /// The reference code's CIFAR-10 augmentation: crop 32 with padding 4, flip, rotation 20.
    pub const CIFAR: Augment = Augment {
        crop_padding: 4,
        flip: true,
        rotate_degrees: 20.0,
    };
}

/// How examples become model inputs.
#[derive(Debug, Clone)]
pub enum Encoding {
    /// Images cut into `patch` x `patch` tokens, channel fastest within a token
    /// (`b c (h p1) (w p2) -> b (h w) (p1 p2 c)`).
    Patches {
        /// Patch side in pixels.
        patch: usize,
        /// Zero-pad each image to this square size first (MNIST at 32x32).
        pad_to: Option<usize>,
        /// Convert RGB to one luma channel (PIL `convert("L")`).
        gray: bool,
        /// Per-channel mean after scaling pixels to [0, 1].
        mean: Vec<f32>,
        /// Per-channel standard deviation.
        std: Vec<f32>,
        /// Training augmentation (evaluation never augments).
        augment: Option<Augment>,
    },
    /// Token ids padded with `pad` to `len` (or to the longest in the batch).
    Tokens {
        /// Tokens per example.
        len: usize,
        /// The padding id.
        pad: u32,
        /// Pad only to the longest sequence of the batch (TAPE's collate) instead of `len`.
        per_batch: bool,
        /// Pad at the start, so the last token is always the example's own.
        left: bool,
    },
    /// Feature vectors padded with zero vectors to `len`.
    Features {
        /// Vectors per example.
        len: usize,
        /// Pad at the start.
        left: bool,
    },
}

impl Encoding {
    /// Height and width of the (padded) image and its channels after conversion.
    fn image_geometry(&self, height: usize, width: usize, channels: usize) -> (usize, usize, usize) {
        match self {
            Encoding::Patches { pad_to, gray, .. } => {
                let (h, w) = pad_to.map(|s| (s, s)).unwrap_or((height, width));
                (h, w, if *gray { 1 } else { channels })
            }
            _ => (height, width, channels),
        }
    }

    /// The model-input batch of examples `idx` of `data`. `rng` drives augmentation, which
    /// applies only when `train` is set.
    pub fn batch(&self, data: &Dataset, idx: &[usize], train: bool, rng: &mut Rng, device: &Device) -> Result<Batch> {
        let n = idx.len();
        let labels: Vec<u32> = idx.iter().map(|&i| data.labels[i]).collect();
        let labels = fpt_nn::transfer::upload(labels, (n, 1), device)?;
        let inputs = match (self, &data.examples) {
            (
                Encoding::Patches {
                    patch,
                    pad_to,
                    gray,
                    mean,
                    std,
                    augment,
                },
                Examples::Images {
                    height,
                    width,
                    channels,
                    pixels,
                },
            ) => {
                let (h, w, c) = self.image_geometry(*height, *width, *channels);
                let p = *patch;
                let (th, tw) = (h / p, w / p);
                let token = p * p * c;
                let size = height * width * channels;
                let mut out = vec![0f32; n * th * tw * token];
                let mut img = vec![0u8; h * w * c];
                for (b, &i) in idx.iter().enumerate() {
                    let src = &pixels[i * size..(i + 1) * size];
                    let aug = if train { *augment } else { None };
                    render(src, *height, *width, *channels, *pad_to, *gray, aug, rng, &mut img);
                    let dst = &mut out[b * th * tw * token..(b + 1) * th * tw * token];
                    for y in 0..h {
                        for x in 0..w {
                            let t = (y / p) * tw + x / p;
                            let within = ((y % p) * p + x % p) * c;
                            for ch in 0..c {
                                let v = img[(y * w + x) * c + ch] as f32 / 255.0;
                                dst[t * token + within + ch] = (v - mean[ch]) / std[ch];
                            }
                        }
                    }
                }
                Inputs::Vectors(fpt_nn::transfer::upload(out, (n, th * tw, token), device)?)
            }
            (
                Encoding::Tokens {
                    len,
                    pad,
                    per_batch,
                    left,
                },
                Examples::Tokens(seqs),
            ) => {
                let t = if *per_batch {
                    idx.iter().map(|&i| seqs[i].len()).max().unwrap_or(1).clamp(1, *len)
                } else {
                    *len
                };
                let mut out = vec![*pad; n * t];
                for (b, &i) in idx.iter().enumerate() {
                    let s = &seqs[i][..seqs[i].len().min(t)];
                    let off = if *left { t - s.len() } else { 0 };
                    out[b * t + off..b * t + off + s.len()].copy_from_slice(s);
                }
                Inputs::Tokens(fpt_nn::transfer::upload(out, (n, t), device)?)
            }
            (Encoding::Features { len, left }, Examples::Features { width, seqs }) => {
                let mut out = vec![0f32; n * len * width];
                for (b, &i) in idx.iter().enumerate() {
                    let s = &seqs[i][..seqs[i].len().min(len * width)];
                    let off = if *left { len * width - s.len() } else { 0 };
                    let at = b * len * width + off;
                    out[at..at + s.len()].copy_from_slice(s);
                }
                Inputs::Vectors(fpt_nn::transfer::upload(out, (n, *len, *width), device)?)
            }
            _ => {
                return Err(TaskError::Invalid {
                    task: "dataset",
                    msg: "the encoding does not fit the examples (internal error)".into(),
                })
            }
        };
        Ok(Batch { inputs, labels })
    }

    /// The input kind and tokens per example this encoding gives for `data`.
    pub fn input(&self, data: &Dataset, vocab: usize) -> (InputKind, usize) {
        match (self, &data.examples) {
            (
                Encoding::Patches { patch, .. },
                Examples::Images {
                    height,
                    width,
                    channels,
                    ..
                },
            ) => {
                let (h, w, c) = self.image_geometry(*height, *width, *channels);
                (
                    InputKind::Vectors {
                        width: patch * patch * c,
                    },
                    (h / patch) * (w / patch),
                )
            }
            (Encoding::Tokens { len, .. }, _) => (InputKind::Tokens { vocab }, *len),
            (Encoding::Features { len, .. }, Examples::Features { width, .. }) => {
                (InputKind::Vectors { width: *width }, *len)
            }
            _ => (InputKind::Tokens { vocab }, 0),
        }
    }
}

/// Renders one image into `out` (`[h, w, c]` after padding and gray conversion), with
/// augmentation when `aug` is set: random crop (zero padding), flip, then rotation, sampled
/// in that order from `rng` and applied in one nearest-neighbour pass.
#[allow(clippy::too_many_arguments)]
fn render(
    src: &[u8],
    height: usize,
    width: usize,
    channels: usize,
    pad_to: Option<usize>,
    gray: bool,
    aug: Option<Augment>,
    rng: &mut Rng,
    out: &mut [u8],
) {
    let (h, w) = pad_to.map(|s| (s, s)).unwrap_or((height, width));
    let (oy, ox) = ((h - height) / 2, (w - width) / 2);
    let c_out = if gray { 1 } else { channels };
    // Pixel of the padded, unaugmented image at (y, x), or None outside it.
    let fetch = |y: isize, x: isize, ch: usize| -> u8 {
        let (y, x) = (y - oy as isize, x - ox as isize);
        if y < 0 || x < 0 || y >= height as isize || x >= width as isize {
            return 0;
        }
        let at = (y as usize * width + x as usize) * channels;
        if gray && channels == 3 {
            // PIL's convert("L"): ITU-R 601-2 luma in 16-bit fixed point, rounded.
            let (r, g, b) = (src[at] as u32, src[at + 1] as u32, src[at + 2] as u32);
            ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16) as u8
        } else {
            src[at + ch]
        }
    };
    let Some(a) = aug else {
        for y in 0..h {
            for x in 0..w {
                for ch in 0..c_out {
                    out[(y * w + x) * c_out + ch] = fetch(y as isize, x as isize, ch);
                }
            }
        }
        return;
    };
    let pad = a.crop_padding as u64;
    let top = rng.below(2 * pad + 1) as isize - pad as isize;
    let left = rng.below(2 * pad + 1) as isize - pad as isize;
    let flip = a.flip && rng.bit();
    let angle = (rng.uniform() * 2.0 - 1.0) * a.rotate_degrees;
    let (sin, cos) = angle.to_radians().sin_cos();
    let (cy, cx) = (h as f64 / 2.0, w as f64 / 2.0);
    for y in 0..h {
        for x in 0..w {
            // Inverse rotation about the centre, to the nearest pixel of the flipped crop.
            let (dy, dx) = (y as f64 + 0.5 - cy, x as f64 + 0.5 - cx);
            let sx = (cos * dx + sin * dy + cx).floor() as isize;
            let sy = (-sin * dx + cos * dy + cy).floor() as isize;
            let inside = sy >= 0 && sx >= 0 && sy < h as isize && sx < w as isize;
            for ch in 0..c_out {
                out[(y * w + x) * c_out + ch] = if inside {
                    let fx = if flip { w as isize - 1 - sx } else { sx };
                    fetch(sy + top, fx + left, ch)
                } else {
                    0
                };
            }
        }
    }
}

/// A classification task over stored datasets: one label per example, read from the last
/// token.
pub struct DatasetTask {
    name: TaskName,
    dims: TaskDims,
    train: Dataset,
    test: Dataset,
    train_sample: Dataset,
    encoding: Encoding,
    /// The run root's `order` fork: epoch `e`'s order is its sub-stream `e`.
    order_rng: Rng,
    cursor: Cursor,
    order: Vec<usize>,
}

impl DatasetTask {
    /// A task over `train` and the evaluation split `test` (already sampled), with `classes`
    /// classes and `vocab` token ids (token inputs). Forks of the run's `root` generator fix
    /// the training order (`order`) and the training-split evaluation sample
    /// (`train-eval-sample`).
    pub fn new(
        name: TaskName,
        train: Dataset,
        test: Dataset,
        encoding: Encoding,
        classes: usize,
        vocab: usize,
        root: &Rng,
    ) -> Result<Self> {
        if train.is_empty() {
            return Err(TaskError::Invalid {
                task: "dataset",
                msg: format!("{name}: the training split is empty"),
            });
        }
        if test.is_empty() {
            return Err(TaskError::Invalid {
                task: "dataset",
                msg: format!("{name}: the evaluation split is empty"),
            });
        }
        let (input, seq_len) = encoding.input(&train, vocab);
        let dims = TaskDims {
            input,
            seq_len,
            readout_tokens: 1,
            labels_per_example: 1,
            classes,
        };
        let mut rng = root.fork("train-eval-sample");
        let train_sample = train.sample(test.len(), &mut rng);
        let order_rng = root.fork("order");
        let mut t = Self {
            name,
            dims,
            train,
            test,
            train_sample,
            encoding,
            order_rng,
            cursor: Cursor::default(),
            order: Vec::new(),
        };
        t.order = t.epoch_order(0);
        Ok(t)
    }

    fn epoch_order(&self, epoch: u64) -> Vec<usize> {
        let mut rng = self.order_rng.substream(epoch);
        permutation(self.train.len(), &mut rng)
    }

    /// The training split.
    pub fn train_set(&self) -> &Dataset {
        &self.train
    }

    /// The evaluation split (after sampling).
    pub fn test_set(&self) -> &Dataset {
        &self.test
    }
}

impl Task for DatasetTask {
    fn name(&self) -> TaskName {
        self.name
    }
    fn dims(&self) -> TaskDims {
        self.dims
    }
    fn train_batch(&mut self, n: usize, rng: &mut Rng, device: &Device) -> Result<Batch> {
        let mut idx = Vec::with_capacity(n);
        while idx.len() < n {
            if self.cursor.position as usize >= self.order.len() {
                self.cursor.epoch += 1;
                self.cursor.position = 0;
                self.order = self.epoch_order(self.cursor.epoch);
            }
            idx.push(self.order[self.cursor.position as usize]);
            self.cursor.position += 1;
        }
        self.encoding.batch(&self.train, &idx, true, rng, device)
    }
    fn eval_len(&self, split: Split) -> usize {
        match split {
            Split::Test => self.test.len(),
            Split::Train => self.train_sample.len(),
        }
    }
    fn eval_batch(&self, split: Split, start: usize, n: usize, device: &Device) -> Result<Batch> {
        let data = match split {
            Split::Test => &self.test,
            Split::Train => &self.train_sample,
        };
        let start = start.min(data.len());
        let idx: Vec<usize> = (start..(start + n).min(data.len())).collect();
        // Evaluation never augments, so this stream is never drawn from.
        let mut unused = Rng::new(0);
        self.encoding.batch(data, &idx, false, &mut unused, device)
    }
    fn cursor(&self) -> Option<Cursor> {
        Some(self.cursor)
    }
    fn set_cursor(&mut self, c: Cursor) -> Result<()> {
        if c.position as usize > self.train.len() {
            return Err(TaskError::Invalid {
                task: "dataset",
                msg: format!(
                    "checkpoint cursor at example {} of an epoch, but the training split has {}",
                    c.position,
                    self.train.len()
                ),
            });
        }
        self.cursor = c;
        self.order = self.epoch_order(c.epoch);
        Ok(())
    }
    fn splits(&self) -> Vec<(&'static str, &Dataset)> {
        vec![("train", &self.train), ("eval", &self.test)]
    }
    fn check_external(&self, data: &Dataset) -> Result<()> {
        let bad = |msg: String| {
            Err(TaskError::Invalid {
                task: "predict",
                msg: format!("{}: {msg}", self.name),
            })
        };
        // Longer than the run's sequences: refused (the model would read a cut it never
        // saw), except where the run's own task cuts every sequence so (ListOps, at its
        // `max_len`, as LRA's pipeline does).
        let cuts = self.name == TaskName::ListOps;
        let longest = match &data.examples {
            Examples::Tokens(seqs) => seqs.iter().map(Vec::len).enumerate().max_by_key(|x| x.1),
            Examples::Features { width, seqs } => seqs
                .iter()
                .map(|r| r.len() / (*width).max(1))
                .enumerate()
                .max_by_key(|x| x.1),
            _ => None,
        };
        if let Some((i, len)) = longest.filter(|&(_, len)| len > self.dims.seq_len && !cuts) {
            return bad(format!(
                "example {i} has {len} time steps; the run was trained on sequences of at most {} (refused: it would be cut where the run never cut its own)",
                self.dims.seq_len
            ));
        }
        match (&self.train.examples, &data.examples, self.dims.input) {
            (Examples::Tokens(_), Examples::Tokens(seqs), InputKind::Tokens { vocab }) => {
                for (i, s) in seqs.iter().enumerate() {
                    if let Some(id) = s.iter().find(|&&id| id as usize >= vocab) {
                        return bad(format!(
                            "example {i}: token id {id} is beyond the run's vocabulary of {vocab} ids (padding included)"
                        ));
                    }
                }
                Ok(())
            }
            (Examples::Features { width: want, .. }, Examples::Features { width, .. }, _) if want == width => Ok(()),
            (
                Examples::Images {
                    height,
                    width,
                    channels,
                    ..
                },
                Examples::Images {
                    height: h,
                    width: w,
                    channels: c,
                    ..
                },
                _,
            ) if (height, width, channels) == (h, w, c) => Ok(()),
            (want, got, _) => bad(format!(
                "the run was trained on {}, the inputs are {}",
                describe_examples(want),
                describe_examples(got)
            )),
        }
    }
    fn encode_external(&self, data: &Dataset, start: usize, n: usize, device: &Device) -> Result<Batch> {
        let start = start.min(data.len());
        let idx: Vec<usize> = (start..(start + n).min(data.len())).collect();
        // As evaluation: no augmentation, so this stream is never drawn from.
        let mut unused = Rng::new(0);
        self.encoding.batch(data, &idx, false, &mut unused, device)
    }
}

/// What examples are, for errors: "token ids", "feature vectors of width 3", "28x28 images
/// of 1 channel".
fn describe_examples(e: &Examples) -> String {
    match e {
        Examples::Tokens(_) => "token ids".into(),
        Examples::Features { width, .. } => format!("feature vectors of width {width}"),
        Examples::Images {
            height,
            width,
            channels,
            ..
        } => format!("{height}x{width} images of {channels} channel(s)"),
    }
}

/// Counts and length statistics of one split, for `fpt inspect --task`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SplitSummary {
    /// Split name.
    pub split: String,
    /// Examples.
    pub examples: usize,
    /// Examples per class id.
    pub label_counts: Vec<usize>,
    /// Sequence lengths before cutting (None for images): min, median, mean, max.
    pub lengths: Option<LengthStats>,
}

/// Sequence length statistics.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LengthStats {
    /// Shortest.
    pub min: u32,
    /// Median.
    pub median: u32,
    /// Mean.
    pub mean: f64,
    /// Longest.
    pub max: u32,
    /// Histogram: `(bucket start, count)` in buckets of `bucket` tokens.
    pub histogram: Vec<(u32, usize)>,
    /// Bucket width.
    pub bucket: u32,
    /// Examples longer than what the model sees (cut).
    pub cut: usize,
}

/// Counts and lengths of a split. `classes` sizes the label histogram.
pub fn summarize(split: &str, data: &Dataset, classes: usize) -> SplitSummary {
    let mut label_counts = vec![0; classes];
    for &l in &data.labels {
        if (l as usize) < classes {
            label_counts[l as usize] += 1;
        }
    }
    let lengths = (!data.lengths.is_empty()).then(|| {
        let mut l = data.lengths.clone();
        l.sort_unstable();
        let max = *l.last().unwrap_or(&0);
        let bucket = (max / 10).max(1).next_power_of_two().max(1);
        let mut histogram: Vec<(u32, usize)> = Vec::new();
        for &v in &l {
            let b = v / bucket * bucket;
            match histogram.last_mut() {
                Some((s, c)) if *s == b => *c += 1,
                _ => histogram.push((b, 1)),
            }
        }
        let cut = (0..data.len())
            .filter(|&i| data.lengths[i] as usize > data.seq_len(i))
            .count();
        LengthStats {
            min: l[0],
            median: l[l.len() / 2],
            mean: l.iter().map(|&v| v as f64).sum::<f64>() / l.len() as f64,
            max,
            histogram,
            bucket,
            cut,
        }
    });
    SplitSummary {
        split: split.to_string(),
        examples: data.len(),
        label_counts,
        lengths,
    }
}

/// Builds a [`DatasetTask`] the way a [`fpt_spec::TaskSpec`] asks: a seeded sample of
/// `train_examples` training examples where set, and of `eval_examples` evaluation examples
/// (0 = all).
#[allow(clippy::too_many_arguments)]
pub fn task_from_spec(
    spec: &fpt_spec::TaskSpec,
    train: Dataset,
    eval: Dataset,
    encoding: Encoding,
    classes: usize,
    vocab: usize,
    root: &Rng,
) -> Result<DatasetTask> {
    let rng = root;
    let train = match spec.train_examples {
        Some(n) => train.sample(n, &mut rng.fork("train-sample")),
        None => train,
    };
    let eval = eval.sample(spec.eval_examples, &mut rng.fork("eval-sample"));
    DatasetTask::new(spec.name, train, eval, encoding, classes, vocab, root)
}

impl Encoding {
    /// Checks that images of `height x width` (read from `file`) fit this encoding: the
    /// padded size, when there is one, is at least the image's, and the (padded) sides are
    /// multiples of the patch.
    pub fn check_image_size(&self, height: usize, width: usize, file: &std::path::Path) -> Result<()> {
        let Encoding::Patches { patch, pad_to, .. } = self else {
            return Ok(());
        };
        if let Some(s) = pad_to {
            if height > *s || width > *s {
                return Err(TaskError::data(
                    file,
                    format!("images are {height}x{width}, larger than the {s}x{s} they are padded to (image size `pad32` needs images of at most {s}x{s}; use `native`)"),
                ));
            }
        }
        let (h, w) = pad_to.map(|s| (s, s)).unwrap_or((height, width));
        if h == 0 || w == 0 || h % patch != 0 || w % patch != 0 {
            return Err(TaskError::data(
                file,
                format!("images are {h}x{w}{}, which {patch}x{patch} patches do not tile (each side must be a multiple of {patch})",
                    if pad_to.is_some() { " after padding" } else { "" }),
            ));
        }
        Ok(())
    }
}

/// The evaluation split a spec names, checked against the task's `allowed` splits;
/// `default` (the reference code's choice) when it names none.
pub fn eval_split<'a>(spec: &fpt_spec::TaskSpec, allowed: &[&'a str], default: &'a str) -> Result<&'a str> {
    match &spec.eval_split {
        None => Ok(default),
        Some(s) => allowed
            .iter()
            .copied()
            .find(|a| a == s)
            .ok_or_else(|| TaskError::Invalid {
                task: "dataset",
                msg: format!(
                    "{}: no evaluation split `{s}` (this task has: {})",
                    spec.name,
                    allowed.join(", ")
                ),
            }),
    }
}
