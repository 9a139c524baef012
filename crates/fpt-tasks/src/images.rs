//! Image tasks: MNIST and Fashion-MNIST (IDX files), CIFAR-10 and CIFAR-10 LRA (the
//! official binary batches), as the reference code feeds them (REFERENCE.md §Tasks):
//!
//! - MNIST / Fashion-MNIST: pixels in [0, 1], 4x4 patches of 16; 28x28 (49 tokens, the
//!   reference code) or zero-padded to 32x32 (64 tokens, the paper's text), no augmentation.
//! - CIFAR-10: 4x4 RGB patches of width 48, channel fastest; normalized with mean
//!   (0.4914, 0.4822, 0.4465) and std (0.2023, 0.1994, 0.2010); training augmentation
//!   (random crop 32 with padding 4, horizontal flip, rotation up to 20 degrees) on by default.
//! - CIFAR-10 LRA: PIL-style grayscale, one pixel per token (1024 tokens of width 1),
//!   normalized to [-1, 1]; the same augmentation switch.

use crate::data::{eval_split, task_from_spec, Augment, Dataset, DatasetTask, Encoding, Examples};
use crate::{idx, Result, TaskError};
use fpt_nn::Rng;
use fpt_spec::{ImageSize, TaskName, TaskSpec};
use std::path::{Path, PathBuf};

/// CIFAR-10's per-channel mean (reference code).
pub const CIFAR_MEAN: [f32; 3] = [0.4914, 0.4822, 0.4465];
/// CIFAR-10's per-channel std (reference code).
pub const CIFAR_STD: [f32; 3] = [0.2023, 0.1994, 0.2010];
/// Bytes per CIFAR-10 binary record: a label byte and 3 x 1024 pixel bytes.
pub const CIFAR_RECORD: usize = 3073;
/// The five training batch files and the test batch file of CIFAR-10's binary version.
pub const CIFAR_TRAIN_FILES: [&str; 5] = [
    "data_batch_1.bin",
    "data_batch_2.bin",
    "data_batch_3.bin",
    "data_batch_4.bin",
    "data_batch_5.bin",
];
/// The test batch file.
pub const CIFAR_TEST_FILE: &str = "test_batch.bin";

/// The IDX file of `stem` (`train-images`, `t10k-labels`, ...) in `dir`, under any of the
/// names it is published with (`-idx3-ubyte`, `.idx3-ubyte`, plain or `.gz`).
pub fn find_idx(dir: &Path, stem: &str) -> Option<PathBuf> {
    let kind = if stem.ends_with("images") { "idx3" } else { "idx1" };
    for sep in ["-", "."] {
        for gz in ["", ".gz"] {
            let p = dir.join(format!("{stem}{sep}{kind}-ubyte{gz}"));
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

/// Reads one MNIST-format split (`{prefix}-images` and `{prefix}-labels`); returns it with
/// the images file's path.
pub fn read_mnist_split(dir: &Path, task: TaskName, prefix: &str) -> Result<(Dataset, PathBuf)> {
    let find = |stem: String| {
        find_idx(dir, &stem).ok_or_else(|| TaskError::Missing {
            task: task.to_string(),
            dir: dir.to_path_buf(),
            what: format!("{stem}-idx*-ubyte[.gz] not found"),
            hint: format!("run `fpt fetch {task}`, or give the directory that holds it"),
        })
    };
    let ip = find(format!("{prefix}-images"))?;
    let lp = find(format!("{prefix}-labels"))?;
    let images = idx::read(&ip)?;
    let labels = idx::read(&lp)?;
    if images.dims.len() != 3 {
        return Err(TaskError::data(
            &ip,
            format!(
                "images must have 3 dimensions [n, rows, cols], the header says {:?}",
                images.dims
            ),
        ));
    }
    if labels.dims.len() != 1 {
        return Err(TaskError::data(
            &lp,
            format!("labels must have 1 dimension [n], the header says {:?}", labels.dims),
        ));
    }
    if images.dims[0] != labels.dims[0] {
        return Err(TaskError::data(
            &lp,
            format!(
                "{} labels for {} images in {}",
                labels.dims[0],
                images.dims[0],
                ip.display()
            ),
        ));
    }
    if let Some(i) = labels.data.iter().position(|&l| l > 9) {
        return Err(TaskError::data(
            &lp,
            format!("label of record {i} is {} (classes are 0-9)", labels.data[i]),
        ));
    }
    let d = Dataset {
        examples: Examples::Images {
            height: images.dims[1],
            width: images.dims[2],
            channels: 1,
            pixels: images.data,
        },
        labels: labels.data.iter().map(|&l| l as u32).collect(),
        lengths: Vec::new(),
    };
    Ok((d, ip))
}

/// MNIST or Fashion-MNIST from `dir`.
pub fn mnist_task(dir: &Path, spec: &TaskSpec, root: &Rng) -> Result<DatasetTask> {
    eval_split(spec, &["test"], "test")?;
    let (train, train_file) = read_mnist_split(dir, spec.name, "train")?;
    let (test, test_file) = read_mnist_split(dir, spec.name, "t10k")?;
    let encoding = Encoding::Patches {
        patch: 4,
        pad_to: match spec.data.image_size {
            ImageSize::Native => None,
            ImageSize::Pad32 => Some(32),
        },
        gray: false,
        mean: vec![0.0],
        std: vec![1.0],
        augment: None,
    };
    let size = |d: &Dataset| match d.examples {
        crate::Examples::Images { height, width, .. } => (height, width),
        _ => (0, 0),
    };
    let ((th, tw), (eh, ew)) = (size(&train), size(&test));
    encoding.check_image_size(th, tw, &train_file)?;
    if (th, tw) != (eh, ew) {
        return Err(TaskError::data(
            &test_file,
            format!(
                "test images are {eh}x{ew}, the training images ({}) {th}x{tw}: both splits must have one size",
                train_file.display()
            ),
        ));
    }
    task_from_spec(spec, train, test, encoding, 10, 0, root)
}

/// Reads CIFAR-10 binary batch files into one split (pixels converted to `[h, w, c]`).
pub fn read_cifar(files: &[PathBuf]) -> Result<Dataset> {
    let mut pixels = Vec::new();
    let mut labels = Vec::new();
    for f in files {
        let b = std::fs::read(f).map_err(TaskError::io(f))?;
        if b.is_empty() || b.len() % CIFAR_RECORD != 0 {
            return Err(TaskError::data(
                f,
                format!(
                    "{} bytes is not a whole number of 3073-byte records (label + 3x32x32 pixels); an official batch is 30,730,000 bytes",
                    b.len()
                ),
            ));
        }
        pixels.reserve(b.len());
        for (r, rec) in b.chunks_exact(CIFAR_RECORD).enumerate() {
            if rec[0] > 9 {
                return Err(TaskError::data(
                    f,
                    format!(
                        "record {r} (byte offset {}): label {} (classes are 0-9)",
                        r * CIFAR_RECORD,
                        rec[0]
                    ),
                ));
            }
            labels.push(rec[0] as u32);
            let planes = &rec[1..];
            for p in 0..1024 {
                pixels.extend_from_slice(&[planes[p], planes[1024 + p], planes[2048 + p]]);
            }
        }
    }
    Ok(Dataset {
        examples: Examples::Images {
            height: 32,
            width: 32,
            channels: 3,
            pixels,
        },
        labels,
        lengths: Vec::new(),
    })
}

/// The directory holding the CIFAR-10 batch files: `dir` or its `cifar-10-batches-bin/`.
pub fn cifar_dir(dir: &Path) -> PathBuf {
    let inner = dir.join("cifar-10-batches-bin");
    if inner.join(CIFAR_TEST_FILE).is_file() {
        inner
    } else {
        dir.to_path_buf()
    }
}

/// CIFAR-10 (RGB 4x4 patches) or CIFAR-10 LRA (gray pixels) from `dir`.
pub fn cifar_task(dir: &Path, spec: &TaskSpec, root: &Rng) -> Result<DatasetTask> {
    eval_split(spec, &["test"], "test")?;
    let d = cifar_dir(dir);
    let path = |f: &str| {
        let p = d.join(f);
        if p.is_file() {
            Ok(p)
        } else {
            Err(TaskError::Missing {
                task: spec.name.to_string(),
                dir: d.clone(),
                what: format!("{f} not found"),
                hint: format!(
                    "run `fpt fetch cifar10` where the network allows (it downloads cifar-10-binary.tar.gz), or unpack that archive into {}",
                    crate::paths::data_dir(TaskName::Cifar10).display()
                ),
            })
        }
    };
    let train_files = CIFAR_TRAIN_FILES.iter().map(|f| path(f)).collect::<Result<Vec<_>>>()?;
    let train = read_cifar(&train_files)?;
    let test = read_cifar(&[path(CIFAR_TEST_FILE)?])?;
    let augment = spec.data.augment.unwrap_or(true).then_some(Augment::CIFAR);
    let encoding = if spec.name == TaskName::Cifar10Lra {
        Encoding::Patches {
            patch: 1,
            pad_to: None,
            gray: true,
            mean: vec![0.5],
            std: vec![0.5],
            augment,
        }
    } else {
        Encoding::Patches {
            patch: 4,
            pad_to: None,
            gray: false,
            mean: CIFAR_MEAN.to_vec(),
            std: CIFAR_STD.to_vec(),
            augment,
        }
    };
    task_from_spec(spec, train, test, encoding, 10, 0, root)
}

/// Images to predict on (`fpt predict --inputs`), from an IDX file of unsigned bytes `[n,
/// rows, cols]` (MNIST's and Fashion-MNIST's format, plain or gzip'd), with their labels from
/// an IDX file `[n]` where given (scored); one channel.
pub fn read_idx_for_prediction(images: &Path, labels: Option<&Path>) -> Result<(Dataset, Vec<Option<u32>>)> {
    let im = idx::read(images)?;
    if im.dims.len() != 3 || im.dims[0] == 0 {
        return Err(TaskError::data(
            images,
            format!(
                "images must have 3 dimensions [n, rows, cols] with n > 0, the header says {:?}",
                im.dims
            ),
        ));
    }
    let n = im.dims[0];
    let given = match labels {
        None => vec![None; n],
        Some(lp) => {
            let l = idx::read(lp)?;
            if l.dims != [n] {
                return Err(TaskError::data(
                    lp,
                    format!(
                        "labels must be [n] = [{n}] for {}, the header says {:?}",
                        images.display(),
                        l.dims
                    ),
                ));
            }
            l.data.iter().map(|&v| Some(v as u32)).collect()
        }
    };
    let d = Dataset {
        examples: Examples::Images {
            height: im.dims[1],
            width: im.dims[2],
            channels: 1,
            pixels: im.data,
        },
        labels: given.iter().map(|l| l.unwrap_or(0)).collect(),
        lengths: Vec::new(),
    };
    Ok((d, given))
}
