//! Every copy fpt makes between host memory and a tensor on a device, in one place that
//! counts them.
//!
//! On a GPU each copy is a transfer over PCIe, and one from pageable host memory waits for
//! the stream: a copy inside a training step keeps the host from running ahead of the GPU.
//! So fpt code makes tensors from host data with [`upload`] (or [`to_device`]) and reads
//! them back with [`download_vec`] / [`download_scalar`], and these count calls and bytes
//! on every device (on the CPU they are plain copies, counted all the same: the code that
//! runs there is the code that runs on a GPU, so a test on the CPU shows what a GPU step
//! would copy). Values made once and reused, such as a causal mask or rotary tables, are
//! kept per device by [`constant`] and uploaded at their first use only.
//!
//! Not counted: candle's own uploads inside its CUDA ops (shapes and strides of
//! non-contiguous operands), and the CPU-only kernels' results, which never leave the host
//! (those use candle's constructors directly and say so where they do).

use candle_core::{Device, Result, Shape, Tensor, WithDType};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

static UPLOADS: AtomicU64 = AtomicU64::new(0);
static UPLOAD_BYTES: AtomicU64 = AtomicU64::new(0);
static DOWNLOADS: AtomicU64 = AtomicU64::new(0);
static DOWNLOAD_BYTES: AtomicU64 = AtomicU64::new(0);

/// The copies counted so far in this process (or between two readings, see
/// [`Counts::since`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Counts {
    /// Copies from the host to a tensor.
    pub uploads: u64,
    /// Their bytes.
    pub upload_bytes: u64,
    /// Copies from a tensor to the host.
    pub downloads: u64,
    /// Their bytes.
    pub download_bytes: u64,
}

impl Counts {
    /// The copies made after `earlier` was read.
    pub fn since(self, earlier: Counts) -> Counts {
        Counts {
            uploads: self.uploads - earlier.uploads,
            upload_bytes: self.upload_bytes - earlier.upload_bytes,
            downloads: self.downloads - earlier.downloads,
            download_bytes: self.download_bytes - earlier.download_bytes,
        }
    }
}

/// The copies counted so far in this process.
pub fn counts() -> Counts {
    Counts {
        uploads: UPLOADS.load(Ordering::Relaxed),
        upload_bytes: UPLOAD_BYTES.load(Ordering::Relaxed),
        downloads: DOWNLOADS.load(Ordering::Relaxed),
        download_bytes: DOWNLOAD_BYTES.load(Ordering::Relaxed),
    }
}

fn count_up(bytes: usize) {
    crate::replay::note_copy("upload");
    UPLOADS.fetch_add(1, Ordering::Relaxed);
    UPLOAD_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
}

fn count_down(bytes: usize) {
    crate::replay::note_copy("download");
    DOWNLOADS.fetch_add(1, Ordering::Relaxed);
    DOWNLOAD_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
}

/// Whether `FPT_CHECK_DEVICE=1` asks for the device's copies to be read back and checked
/// (each upload against the host data, each embedding's ids against its table): a
/// diagnostic for a device whose results look wrong, at the cost of a wait for the device
/// at every checked copy. Off by default; the CPU's copies are never read back.
pub fn checking(device: &Device) -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    !device.is_cpu() && *ON.get_or_init(|| std::env::var("FPT_CHECK_DEVICE").is_ok_and(|v| v.trim() == "1"))
}

/// A tensor on `device` holding `data` (row-major, `shape`): one counted upload (read back
/// and compared under [`checking`]).
pub fn upload<T: WithDType, S: Into<Shape>>(data: Vec<T>, shape: S, device: &Device) -> Result<Tensor> {
    count_up(data.len() * std::mem::size_of::<T>());
    if !checking(device) {
        return Tensor::from_vec(data, shape, device);
    }
    let t = Tensor::from_slice(&data, shape, device)?;
    let back = t.flatten_all()?.to_vec1::<T>()?;
    if let Some(i) = (0..data.len()).find(|&i| back[i] != data[i]) {
        candle_core::bail!(
            "FPT_CHECK_DEVICE: an upload of {} values to {:?} reads back {} at element {i} where the host sent {}",
            data.len(),
            device.location(),
            back[i].to_f64(),
            data[i].to_f64()
        )
    }
    Ok(t)
}

/// A tensor on `device` holding a copy of `data`: one counted upload.
pub fn upload_slice<T: WithDType, S: Into<Shape>>(data: &[T], shape: S, device: &Device) -> Result<Tensor> {
    count_up(std::mem::size_of_val(data));
    Tensor::from_slice(data, shape, device)
}

/// `t` on `device`: a counted copy when it moves between the host and a GPU, `t` itself
/// when it is there already.
pub fn to_device(t: &Tensor, device: &Device) -> Result<Tensor> {
    if t.device().same_device(device) {
        return Ok(t.clone());
    }
    let bytes = t.elem_count() * t.dtype().size_in_bytes();
    if device.is_cpu() {
        count_down(bytes);
    } else {
        count_up(bytes);
    }
    t.to_device(device)
}

/// Every element of `t` (any shape), row-major: one counted download.
pub fn download_vec<T: WithDType>(t: &Tensor) -> Result<Vec<T>> {
    count_down(t.elem_count() * t.dtype().size_in_bytes());
    t.flatten_all()?.to_vec1::<T>()
}

/// The value of a one-element tensor: one counted download.
pub fn download_scalar<T: WithDType>(t: &Tensor) -> Result<T> {
    if t.elem_count() != 1 {
        candle_core::bail!("download_scalar: a tensor of shape {:?} is not one value", t.shape())
    }
    count_down(t.dtype().size_in_bytes());
    t.flatten_all()?.get(0)?.to_scalar::<T>()
}

/// The most constants kept at once; past it the cache starts again (a run uses a handful:
/// one per distinct shape of mask or table).
const CONSTANT_SLOTS: usize = 256;

/// Keyed by the device itself (its `Debug`: `Cuda(CudaDevice(DeviceId(n)))`), not its
/// location: two devices on one GPU are two streams (`crate::device::parse`), and a constant
/// one made must not be read on the other's stream unordered.
type ConstantCache = Mutex<HashMap<(String, String), Tensor>>;

fn constants() -> &'static ConstantCache {
    static C: OnceLock<ConstantCache> = OnceLock::new();
    C.get_or_init(Default::default)
}

/// The constant named `key` on `device` (a causal mask, rotary tables, relative-position
/// buckets): made by `make` (which uploads it, counted) at its first use on that device,
/// the same tensor afterwards. `key` must name everything the value depends on.
pub fn constant(key: String, device: &Device, make: impl FnOnce() -> Result<Tensor>) -> Result<Tensor> {
    let slot = (key, format!("{device:?}"));
    if let Some(t) = constants().lock().unwrap_or_else(|e| e.into_inner()).get(&slot) {
        return Ok(t.clone());
    }
    let t = make()?.detach();
    let mut cache = constants().lock().unwrap_or_else(|e| e.into_inner());
    if cache.len() >= CONSTANT_SLOTS {
        cache.clear();
    }
    cache.insert(slot, t.clone());
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_counted_and_constants_made_once() -> Result<()> {
        let dev = Device::Cpu;
        let before = counts();
        let t = upload(vec![1f32, 2.0, 3.0], 3, &dev)?;
        assert_eq!(download_vec::<f32>(&t)?, [1.0, 2.0, 3.0]);
        assert_eq!(download_scalar::<f32>(&t.sum_all()?)?, 6.0);
        assert!(download_scalar::<f32>(&t).is_err());
        let mut made = 0;
        for _ in 0..3 {
            let c = constant("transfer-test-ramp:4".into(), &dev, || {
                made += 1;
                upload((0..4u32).collect(), 4, &dev)
            })?;
            assert_eq!(c.dims(), [4]);
        }
        assert_eq!(made, 1);
        let d = counts().since(before);
        // Other tests of this binary may copy meanwhile: at least these.
        assert!(d.uploads >= 2 && d.upload_bytes >= 12 + 16, "{d:?}");
        assert!(d.downloads >= 2 && d.download_bytes >= 12 + 4, "{d:?}");
        Ok(())
    }
}
