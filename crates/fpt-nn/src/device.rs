//! Devices by name: `cpu`, `cuda`, `cuda:N`. The tests and `fpt selfcheck` take theirs from
//! `FPT_DEVICE` (default `cpu`), so the same golden, self-check and trajectory-parity tests
//! run unchanged on a GPU (`FPT_DEVICE=cuda:0` with a `--features cuda` build).

use candle_core::{Device, Result};

/// The device `name` names. A CUDA name in a build without the `cuda` feature, or without
/// a usable GPU, is an error that says which.
pub fn parse(name: &str) -> Result<Device> {
    match name {
        "cpu" => Ok(Device::Cpu),
        _ => {
            let ordinal = match name.strip_prefix("cuda") {
                Some("") => 0,
                Some(rest) => rest.strip_prefix(':').and_then(|n| n.parse().ok()).ok_or_else(|| {
                    candle_core::Error::Msg(format!("bad device `{name}` (expected cpu, cuda or cuda:N)"))
                })?,
                None => {
                    return Err(candle_core::Error::Msg(format!(
                        "unknown device `{name}` (expected cpu, cuda or cuda:N)"
                    )))
                }
            };
            if !cfg!(feature = "cuda") {
                return Err(candle_core::Error::Msg(format!(
                    "device `{name}`: this build has no CUDA support (build with `--features cuda`, see docs/backbones.md, section GPU)"
                )));
            }
            cuda(ordinal).map_err(|e| candle_core::Error::Msg(format!("device `{name}`: CUDA could not start ({e})")))
        }
    }
}

/// GPU `ordinal` with a stream of its own, on which all of its work runs in the order
/// enqueued. Not candle's `Device::new_cuda`: that device enqueues on the calling thread's
/// per-thread default stream, so work from two threads (fpt runs a step on a pool worker,
/// draws and uploads batches on the caller) lands on two streams, unordered: an upload
/// raced the step that read it, and memory freed on one stream was handed out on the other
/// while still in use (ListOps on an H100, 2026-11-27: token ids and labels overwritten
/// by floats, gone under `CUDA_LAUNCH_BLOCKING=1`; docs/correctness.md).
#[cfg(feature = "cuda")]
fn cuda(ordinal: usize) -> Result<Device> {
    let dev = candle_core::CudaDevice::new_with_stream(ordinal)?;
    if !cuda_events_requested()? {
        // SAFETY: cudarc's event tracking orders a buffer's uses across streams; every
        // buffer of this device is allocated, used and freed on its one stream (candle
        // enqueues all of a `CudaDevice`'s work there, fpt's kernels launch through it and
        // its cuBLASLt handle is bound to it), and candle refuses ops mixing two devices,
        // so no buffer meets a second stream and the events would order nothing.
        // `FPT_CUDA_EVENTS=on` keeps them; bench/gpu/sanitize.sh runs this under
        // compute-sanitizer.
        unsafe { dev.disable_event_tracking() };
    }
    Ok(Device::Cuda(dev))
}

/// Without the `cuda` feature there is no GPU to start (`parse` said so already).
#[cfg(not(feature = "cuda"))]
fn cuda(ordinal: usize) -> Result<Device> {
    Device::new_cuda(ordinal)
}

/// Whether `FPT_CUDA_EVENTS=on` keeps cudarc's event tracking on a GPU (an event recorded
/// per kernel operand, for buffers shared between streams); unset, empty or `auto` turn it
/// off, since each fpt device has one stream; anything else is refused, naming the variable.
pub fn cuda_events_requested() -> Result<bool> {
    static CHOICE: std::sync::OnceLock<std::result::Result<bool, String>> = std::sync::OnceLock::new();
    CHOICE
        .get_or_init(|| {
            crate::ops::parse_switch(
                "FPT_CUDA_EVENTS",
                std::env::var("FPT_CUDA_EVENTS").ok().as_deref(),
                "on",
                "cudarc's event per kernel operand",
            )
        })
        .clone()
        .map_err(candle_core::Error::Msg)
}

/// The device `FPT_DEVICE` names (default `cpu`).
pub fn from_env() -> Result<Device> {
    match std::env::var("FPT_DEVICE") {
        Ok(v) if !v.is_empty() => parse(&v).map_err(|e| candle_core::Error::Msg(format!("FPT_DEVICE: {e}"))),
        _ => Ok(Device::Cpu),
    }
}

/// A short name for `device`: `cpu` or `cuda:N`.
pub fn name(device: &Device) -> String {
    match device.location() {
        candle_core::DeviceLocation::Cpu => "cpu".into(),
        candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_parse_or_say_what_is_wrong() {
        assert!(super::parse("cpu").unwrap().is_cpu());
        for bad in ["gpu", "cuda:x", "cuda:"] {
            assert!(super::parse(bad).is_err(), "{bad}");
        }
        if !cfg!(feature = "cuda") {
            let e = super::parse("cuda:0").unwrap_err().to_string();
            assert!(e.contains("--features cuda"), "{e}");
        }
    }
}
